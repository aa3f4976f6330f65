"""How two results agree: greedy generations equal up to a float tie, readings within REL.

Greedy ids agree when equal, or when they first differ where the two best log-probabilities
(the logit gap) are within TIE of each other, a tie float rounding may break either way;
readings agree within REL, relative (floored at 1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from miserver.engines.base import Token

TIE = 1e-3  # a first divergence at a top-2 gap below this (nats) is a float tie
REL = 1e-3  # readings agree within this, relative to max(1, |reference|)


@dataclass(frozen=True, slots=True)
class Greedy:
    """A greedy generation's tokens (ids, or texts off the wire) and at each the gap between
    its two best log-probabilities, which is the logit gap."""

    tokens: tuple[int | str, ...]
    gaps: tuple[float, ...]


def divergence(a: Greedy, b: Greedy) -> tuple[int, float] | None:
    """Where two generations first differ and the smaller top-2 gap there; None: equal."""
    for at, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if x != y:
            return at, min(a.gaps[at], b.gaps[at])
    if len(a.tokens) == len(b.tokens):
        return None
    return min(len(a.tokens), len(b.tokens)), math.inf


def agreement(pairs: Sequence[tuple[Greedy, Greedy]]) -> tuple[bool, str]:
    """Each pair equal, or first differing at a tie (gap < TIE); the figure counts the equal
    pairs and names each divergence (prompt, token, gap)."""
    found = [divergence(a, b) for a, b in pairs]
    notes = [f"#{i} at token {d[0]}, gap {d[1]:.1e}" for i, d in enumerate(found) if d]
    figure = f"{sum(d is None for d in found)}/{len(pairs)} identical"
    return all(d is None or d[1] < TIE for d in found), figure + "".join(f"; {n}" for n in notes)


def _gap(token: Token) -> float:
    top: tuple[tuple[int, float], ...] = () if token.logprobs is None else token.logprobs.top
    return top[0][1] - top[1][1] if len(top) > 1 else math.inf


def of_tokens(tokens: Sequence[Token]) -> Greedy:
    return Greedy(tuple(t.token_id for t in tokens), tuple(_gap(t) for t in tokens))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest |got - want| / max(1, |want|)."""
    want = want.double()
    return float(((got.double() - want).abs() / want.abs().clamp(min=1.0)).max())
