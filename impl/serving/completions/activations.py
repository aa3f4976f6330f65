"""Per-request SAE activations (`return_sae_activations`, OAI-ACT): what a request
asks and its refusals; reading.py resolves it and reads the rows.

Positions are absolute over the prompt's tokens, then the generated ones
(OAI-ACT-04).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidParameter
from ...steering.sae import SAE

FIELD = "return_sae_activations"
POSITION_NAMES = ("last", "prompt", "completion", "all")
DEFAULT_POSITIONS = "last"
DEFAULT_TOP_K = 8
READ_POINTS = ("post_steering", "pre_steering")
NOTES = {
    "unsteered": (
        "unsteered: a scoring request runs one forward pass with no steering hook; these are "
        "the activations of that pass."
    ),
    "post_steering": (
        "post_steering is what the model computed at this layer for this request, "
        "this layer's steering delta included; it is not an unsteered counterfactual."
    ),
    "pre_steering": (
        "pre_steering is this layer's output before its own steering delta; steering at "
        "earlier layers, and tokens generated under steering, still shape it."
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationsAsk:
    """A request's `return_sae_activations`, defaults filled in."""

    sae_id: str | None = None
    features: tuple[int, ...] | None = None
    top_k: int = DEFAULT_TOP_K
    positions: str | tuple[int, int] = DEFAULT_POSITIONS
    read_point: str = "post_steering"

    @classmethod
    def of(cls, sent: Mapping[str, Any]) -> ActivationsAsk:
        """The ask from the field's JSON (the schema has checked its types)."""
        positions: str | tuple[int, int] = DEFAULT_POSITIONS
        raw = sent.get("positions")
        if isinstance(raw, Mapping):
            positions = (int(raw["start"]), int(raw["end"]))
        elif raw is not None:
            positions = str(raw)
        features = sent.get("features")
        return cls(
            sae_id=sent.get("sae_id"),
            features=None if features is None else tuple(int(i) for i in features),
            top_k=DEFAULT_TOP_K if sent.get("top_k") is None else int(sent["top_k"]),
            positions=positions,
            read_point=sent.get("read_point") or "post_steering",
        )

    @property
    def pre_steering(self) -> bool:
        return self.read_point == "pre_steering"

    def worst_case_positions(self, prompt_tokens: int, max_tokens: int) -> int:
        """The most positions this ask may list, `max_tokens` counted in full (OAI-ACT-23)."""
        positions = self.positions
        if isinstance(positions, tuple):
            return max(0, positions[1] - positions[0])
        return {
            "last": 1,
            "prompt": prompt_tokens,
            "completion": max_tokens,
            "all": prompt_tokens + max_tokens,
        }[positions]


def check_ask(ask: ActivationsAsk, *, max_top_k: int) -> None:
    """The refusals that need neither the SAE nor the prompt."""
    if ask.read_point not in READ_POINTS:
        raise InvalidParameter(
            f"{FIELD}.read_point", f"`read_point` is one of {', '.join(READ_POINTS)}."
        )
    positions = ask.positions
    if isinstance(positions, tuple):
        start, end = positions
        if start < 0 or end < start:
            raise InvalidParameter(
                f"{FIELD}.positions",
                f"positions {{start: {start}, end: {end}}} is not a half-open range "
                "0 <= start <= end.",
            )
    elif positions not in POSITION_NAMES:
        raise InvalidParameter(
            f"{FIELD}.positions",
            f"`positions` is one of {', '.join(POSITION_NAMES)} or {{start, end}}.",
        )
    if not 1 <= ask.top_k <= max_top_k:
        raise InvalidParameter(
            f"{FIELD}.top_k",
            f"`top_k` {ask.top_k} is outside 1..{max_top_k} (SAE_ACTIVATIONS_MAX_TOP_K).",
        )


def choose_sae(ask: ActivationsAsk, attached: Sequence[str]) -> str:
    """The attached SAE the ask reads (OAI-ACT-19/20): the one named, or the only one."""
    names = ", ".join(sorted(attached)) or "none"
    if ask.sae_id is not None:
        if ask.sae_id not in attached:
            raise InvalidParameter(
                f"{FIELD}.sae_id",
                f"no SAE `{ask.sae_id}` is attached to this model (attached: {names}).",
            )
        return ask.sae_id
    if not attached:
        raise InvalidParameter(
            FIELD,
            "no SAE is attached to this model; attach one first (POST /api/steering/attachments).",
        )
    if len(attached) > 1:
        raise InvalidParameter(
            f"{FIELD}.sae_id",
            f"several SAEs are attached ({names}): name one in `sae_id`.",
        )
    return attached[0]


def check_sae(ask: ActivationsAsk, sae: SAE) -> None:
    """A candidate feature at or past the SAE's width is refused (OAI-ACT-21)."""
    for i, index in enumerate(ask.features or ()):
        if not 0 <= index < sae.d_sae:
            raise InvalidParameter(
                f"{FIELD}.features[{i}]",
                f"feature index {index} is outside 0..{sae.d_sae - 1} (the SAE's d_sae).",
            )


def check_entries(
    ask: ActivationsAsk, *, prompt_tokens: int, max_tokens: int, max_entries: int
) -> None:
    """The worst-case entry count, positions x top_k, against the limit (OAI-ACT-23)."""
    positions = ask.worst_case_positions(prompt_tokens, max_tokens)
    entries = positions * ask.top_k
    if entries > max_entries:
        raise InvalidParameter(
            FIELD,
            f"up to {positions} positions x top_k {ask.top_k} = {entries} entries is over "
            f"{max_entries} (SAE_ACTIVATIONS_MAX_ENTRIES); ask for fewer positions or a "
            "smaller top_k.",
        )


def read_positions(positions: str | tuple[int, int], prompt_tokens: int, fed: int) -> range:
    """The positions read: those asked for among the `fed` the model ran (OAI-ACT-05/06)."""
    if isinstance(positions, tuple):
        return range(min(positions[0], fed), min(positions[1], fed))
    if positions == "last":
        return range(max(0, fed - 1), fed)
    if positions == "prompt":
        return range(0, min(prompt_tokens, fed))
    if positions == "completion":
        return range(min(prompt_tokens, fed), fed)
    return range(0, fed)
