"""The X-miLLM-* headers: values in, RFC 8941 text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import ApiError, InvalidParameter

STRICT = "X-miLLM-Strict"
IGNORED = "X-miLLM-Ignored-Fields"
MODEL = "X-miLLM-Model"
SEED = "X-miLLM-Seed"
STEERING = "X-miLLM-Steering"
STEERING_INTENSITY = "X-miLLM-Steering-Intensity"
CIRCUIT_RUNG = "X-miLLM-Circuit-Rung"
PROBE_VERDICTS = "X-miLLM-Probe-Verdicts"
SCORING_PRECISION = "X-miLLM-Scoring-Precision"
CONSTRAINED = "X-miLLM-Constrained"
TOOL_FORMAT = "X-miLLM-Tool-Format"
SCORING_PRECISION_REASON = "X-miLLM-Scoring-Precision-Reason"

_STRICT_VALUES = {"true": True, "1": True, "false": False, "0": False}


def sf_string(text: str) -> str:
    """An RFC 8941 String (the text must be printable ASCII)."""
    if any(not 0x20 <= ord(c) <= 0x7E for c in text):
        raise ValueError(f"not printable ASCII: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ignored_fields(locations: Sequence[str], max_bytes: int) -> str | None:
    """The X-miLLM-Ignored-Fields value, at most `max_bytes` long, or None when empty.

    Past the cap, the longest prefix of locations that fits together with a
    final `"+N more"` entry is kept (the cap includes that entry).
    """
    if not locations:
        return None
    items = [sf_string(loc) for loc in locations]
    whole = ", ".join(items)
    if len(whole) <= max_bytes:
        return whole
    for keep in range(len(items) - 1, -1, -1):
        more = sf_string(f"+{len(items) - keep} more")
        value = ", ".join([*items[:keep], more])
        if len(value) <= max_bytes:
            return value
    return sf_string(f"+{len(items)} more")


def strict_mode(headers: Mapping[str, str]) -> bool:
    """Whether X-miLLM-Strict asks to refuse unused fields; 400 on a bad value."""
    raw = headers.get(STRICT)
    if raw is None:
        return False
    value = _STRICT_VALUES.get(raw.strip())
    if value is None:
        raise InvalidParameter(STRICT, f"{STRICT} must be true, false, 1 or 0, not {raw!r}.")
    return value


def refuse_unused(locations: Sequence[str]) -> ApiError:
    """400 unused_fields_refused naming every unused location."""
    names = ", ".join(locations)
    return ApiError(
        "unused_fields_refused",
        f"{STRICT} is set and these request fields are not used: {names}.",
        locations[0],
    )


def seed(value: int, scope: str) -> str:
    """X-miLLM-Seed: an RFC 8941 Integer with a `scope` String parameter."""
    return f"{value};scope={sf_string(scope)}"
