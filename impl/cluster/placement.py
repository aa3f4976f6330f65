"""Which replica takes a request: the longest prefix it holds, its steering set, its load.

The rule the cluster's router (router.py) applies and the simulation
(tools/cluster_sim.py) measures, kept free of Ray:

1. Replicas more than `SLACK` requests busier than the least busy one are left
   out: affinity never piles a queue onto one replica while another idles.
2. Of the rest, the one holding the longest prefix of the prompt comes first
   (its prompt cache restores it instead of a prefill), then one already
   running the request's steering set (its rows batch together), then the
   least busy.
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
    if not any(c.held or c.same_steering for c in eligible):
        return [two_choices(candidates, rng or random.Random())]
    order = sorted(eligible, key=lambda c: (-c.held, not c.same_steering, c.load))
    rest = sorted((c for c in candidates if c not in eligible), key=lambda c: c.load)
    return [[order[0].replica], [c.replica for c in [*order[1:], *rest]]]


def two_choices(candidates: Sequence[Candidate], rng: random.Random) -> list[str]:
    """Power of two choices: two drawn at random, the less busy first."""
    drawn = rng.sample(list(candidates), min(2, len(candidates)))
    return [c.replica for c in sorted(drawn, key=lambda c: c.load)]
