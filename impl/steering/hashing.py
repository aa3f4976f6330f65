"""The steering-set hash (OAI-HASH): public API for clients.

A client that sent a steering set can recompute the `hash` parameter of the
`inline`, `profile` or `manual` member of `X-miLLM-Steering` and compare::

    >>> from miserver.steering import steering_set_hash
    >>> steering_set_hash(
    ...     "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11", [{"index": 1234, "strength": 8.0}]
    ... )
    'sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105'

The hash covers the SAE ID and the applied set only, never the layer. The
applied set maps each index to `clamp(float(strength), -200, 200)` in binary64,
with zeros (and `-0.0`) dropped; for a profile, pass `stored * λ` as strength.
The canonical form is UTF-8, every line ended by one LF::

    millm.steering-set/v1
    sae=<sae_id>
    <index>:<16 lowercase hex digits of struct.pack(">d", strength)>   (ascending index)

and the hash is `"sha256:" + sha256(canonical form).hexdigest()`. Features are
mappings with `index` and `strength`, or `(index, strength)` pairs; a later
duplicate index replaces an earlier one. Booleans, negative indices and
non-finite strengths are refused with TypeError or ValueError.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Mapping

HEADER_LINE = "millm.steering-set/v1"
LIMIT = 200.0

Feature = Mapping[str, object] | tuple[object, object]


def clamp(strength: float) -> float:
    """The ±200 clamp the hooks apply (binary64)."""
    return max(-LIMIT, min(LIMIT, strength))


def scaled(strengths: Mapping[int, float], scale: float) -> tuple[dict[int, float], int]:
    """index -> clamp(strength × scale) in binary64, zeros dropped, and how many strengths the
    clamp changed: what a profile or a circuit member applies at λ = `scale`."""
    applied: dict[int, float] = {}
    clamped = 0
    for index, strength in sorted(strengths.items()):
        raw = float(strength) * float(scale)
        value = clamp(raw)
        clamped += value != raw
        if value != 0.0:
            applied[index] = value
    return applied, clamped


def _index(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"feature index must be an int, not {value!r}")
    if value < 0:
        raise ValueError(f"feature index must be >= 0, not {value}")
    return value


def _strength(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"feature strength must be a number, not {value!r}")
    strength = float(value)
    if not math.isfinite(strength):
        raise ValueError(f"feature strength must be finite, not {strength!r}")
    return strength


def _pair(feature: Feature) -> tuple[int, float]:
    if isinstance(feature, Mapping):
        missing = {"index", "strength"} - set(feature)
        if missing:
            raise ValueError(f"feature {dict(feature)!r} lacks {sorted(missing)}")
        return _index(feature["index"]), _strength(feature["strength"])
    if isinstance(feature, tuple) and len(feature) == 2:
        return _index(feature[0]), _strength(feature[1])
    raise TypeError(f"a feature is a mapping or an (index, strength) pair, not {feature!r}")


def requested(features: Iterable[Feature]) -> dict[int, float]:
    """Index -> strength as sent (validated, not clamped); later duplicates win."""
    return dict(_pair(feature) for feature in features)


def applied_set(features: Iterable[Feature]) -> dict[int, float]:
    """Index -> applied strength: clamped to ±200, zeros dropped (OAI-HASH-03)."""
    applied = {index: clamp(strength) for index, strength in requested(features).items()}
    return {index: strength for index, strength in applied.items() if strength != 0.0}


def clamped_count(features: Iterable[Feature]) -> int:
    """How many features the ±200 clamp changed (the `clamped` parameter)."""
    return sum(1 for s in requested(features).values() if clamp(s) != s)


def canonical_form(sae_id: str, features: Iterable[Feature]) -> str:
    """The canonical text that is hashed (OAI-HASH-07)."""
    applied = applied_set(features)
    lines = [HEADER_LINE, f"sae={sae_id}"]
    lines += [f"{i}:{struct.pack('>d', applied[i]).hex()}" for i in sorted(applied)]
    return "".join(line + "\n" for line in lines)


def steering_set_hash(sae_id: str, features: Iterable[Feature]) -> str:
    """`sha256:` + 64 lowercase hex digits over the canonical form (OAI-HASH-13)."""
    digest = hashlib.sha256(canonical_form(sae_id, features).encode("utf-8")).hexdigest()
    return f"sha256:{digest}"
