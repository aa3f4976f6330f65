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

A circuit's λ (`circuit_lambda`) is clamped from both sides instead: into its
declared range intersected with the configured envelope
([CIRCUIT_INTENSITY_MIN, CIRCUIT_INTENSITY_MAX] within [0, 2], open point
15), or that envelope; only an exact 0 or "off" is below the floor (off),
and without a declared range "min" is "off" (OAI-CIRCUIT-03..07).
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
    def within(cls, declared: Sequence[float] | None, envelope: Bounds) -> Bounds:
        """A declared range intersected with `envelope` (the envelope when none is)."""
        if declared is None:
            return envelope
        low, high = (float(v) for v in declared)
        low, high = max(low, envelope.low), min(high, envelope.high)
        return cls(low, max(low, high))

    @classmethod
    def configured(cls, minimum: float, maximum: float) -> Bounds:
        """The server's bounds for ranges nobody declared, within the envelope."""
        return cls(max(minimum, ENVELOPE[0]), min(maximum, ENVELOPE[1]))


def is_off(value: Dial | None) -> bool:
    """True for `"off"` and for a numeric 0 (OAI-DIAL-11)."""
    return value == "off" or (not isinstance(value, str) and value is not None and value == 0)


def _symbol(value: Dial, bounds: Bounds) -> float | None:
    """The λ a symbol names ("off", "min", "max"); None for a number."""
    if value == "off":
        return 0.0
    if value == "min":
        return bounds.low
    if value == "max":
        return bounds.high
    if isinstance(value, str):
        raise ValueError(f"unknown dial symbol {value!r} (known: {', '.join(SYMBOLS)})")
    return None


def cluster_lambda(value: Dial, bounds: Bounds) -> float:
    """The effective λ of `value` within `bounds`."""
    named = _symbol(value, bounds)
    return named if named is not None else max(0.0, min(float(value), bounds.high))


def circuit_lambda(value: Dial, bounds: Bounds, *, declared: bool) -> float:
    """The effective λ of `value` for a circuit (OAI-CIRCUIT-03..07): unlike a cluster's,
    a numeric λ is clamped into `bounds` from both sides (0.1 against [0.5, 1.5] is 0.5);
    only an exact 0 or "off" goes below the floor, to off; without a `declared` range
    "min" is "off"."""
    if is_off(value) or (value == "min" and not declared):
        return 0.0
    named = _symbol(value, bounds)
    return named if named is not None else max(bounds.low, min(float(value), bounds.high))
