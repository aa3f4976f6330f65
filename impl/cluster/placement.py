"""Which replica takes a request: the longest prefix it holds, its steering set, its load.

The rule the cluster's router (router.py) applies and the simulation
(tools/bench/cluster_sim.py) measures, kept free of Ray:

1. Replicas more than `SLACK` requests busier than the least busy one are left
   out: affinity never piles a queue onto one replica while another idles.
2. Of the rest, those holding the longest prefix of the prompt come first
   (their prompt cache restores it instead of a prefill), and of those, the
   ones that ran the request's steering set lately (its rows batch together);
   Serve takes the least busy of them.
3. With no prefix held and no steering set shared anywhere, power of two
   choices: two replicas drawn at random, the less busy first.

`ranked` returns ranks, most preferred first, as Ray Serve's request router
takes them; within a rank Serve picks the replica with the shortest queue that
accepts the request.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

SLACK = 2  # requests a preferred replica may have in flight beyond the least busy one


@dataclass(frozen=True, slots=True)
class Candidate:
    replica: str
    load: int  # requests in flight
    held: int = 0  # how many of the request's prefix pieces it holds
    same_steering: bool = False  # runs rows under the request's steering set


def ranked(candidates: Sequence[Candidate], rng: random.Random | None = None) -> list[list[str]]:
    """The replicas in ranks, most preferred first."""
    if not candidates:
        return []
    least = min(c.load for c in candidates)
    eligible = [c for c in candidates if c.load <= least + SLACK]
    rng = rng or random.Random()
    if not any(c.held or c.same_steering for c in eligible):
        return [two_choices(candidates, rng)]
    best = max((c.held, c.same_steering) for c in eligible)
    first = [c for c in eligible if (c.held, c.same_steering) == best]
    rng.shuffle(first)  # equals in random order: no replica is everyone's first
    first.sort(key=lambda c: c.load)
    rest = sorted((c for c in candidates if c not in first), key=lambda c: c.load)
    return (
        [[c.replica for c in first], [c.replica for c in rest]]
        if rest
        else [[c.replica for c in first]]
    )


def two_choices(candidates: Sequence[Candidate], rng: random.Random) -> list[str]:
    """Power of two choices: two drawn at random, the less busy first."""
    drawn = rng.sample(list(candidates), min(2, len(candidates)))
    return [c.replica for c in sorted(drawn, key=lambda c: c.load)]
