"""The intensity dial λ (OAI-DIAL): what a request's `steering_intensity` resolves to.

A profile (an imported cluster, stored by the management API) may declare
an `intensity_range`; its bounds are intersected with the dial envelope
[0, 2]. Without one, the bounds are the server's CLUSTER_INTENSITY_MIN and
CLUSTER_INTENSITY_MAX (docs/DECISIONS.md, the dial's floor and envelope). Then:

    "off", 0      0 (steering off for the request; the base is not validated)
    "min"         the lower bound
    "max"         the upper bound
    a number      capped at the upper bound, never raised to the lower one

A profile's stored (persistent) dial resolves by the same rule; a request's
λ overrides it for that request only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ENVELOPE = (0.0, 2.0)
SYMBOLS = ("off", "min", "max")

Dial = float | str


@dataclass(frozen=True, slots=True)
class Bounds:
    low: float
    high: float

    @classmethod
    def of(cls, declared: Sequence[float] | None, default: Bounds) -> Bounds:
        """A declared `intensity_range` within the envelope, or `default`."""
        if declared is None:
            return default
        low, high = (float(v) for v in declared)
        return cls(max(low, ENVELOPE[0]), min(high, ENVELOPE[1]))

    @classmethod
    def configured(cls, minimum: float, maximum: float) -> Bounds:
        """The server's bounds for ranges nobody declared, within the envelope."""
        return cls(max(minimum, ENVELOPE[0]), min(maximum, ENVELOPE[1]))


def is_off(value: Dial | None) -> bool:
    """True for `"off"` and for a numeric 0 (OAI-DIAL-11)."""
    return value == "off" or (not isinstance(value, str) and value is not None and value == 0)


def resolve(value: Dial, bounds: Bounds) -> float:
    """The effective λ of `value` within `bounds`."""
    if value == "off":
        return 0.0
    if value == "min":
        return bounds.low
    if value == "max":
        return bounds.high
    if isinstance(value, str):
        raise ValueError(f"unknown dial symbol {value!r} (known: {', '.join(SYMBOLS)})")
    return max(0.0, min(float(value), bounds.high))
