"""The engine replicas' request router: Ray Serve's, told about prefixes and steering.

For each request the router (one per deployment handle, in the ingress and in
the control) ranks the live replicas by placement.py's rule: the longest prefix
of the prompt it remembers sending to a replica (that replica's prompt cache
holds it), then a replica that ran the same steering set in the last
`STEERING_WINDOW_S` seconds, then load (Serve's cached queue lengths); with no
affinity anywhere, power of two choices. A request naming its replica
(`Forwarded.replica`, an operation every replica answers) goes only there, or,
when that replica is gone, wherever Serve's default would send it (it must not
wait for a replica that will not come back).

What it remembers is what it routed: up to `MAX_PREFIXES` prefix hashes, the
oldest forgotten first, each with every replica it went to in the last
`HELD_S` seconds (a system prompt many conversations share is held by many
replicas). A replica that died is dropped by Serve from the candidates, and one a
request's earlier try lost (`Forwarded.avoid`) is passed over while another lives.

The ingress only picks (`PICK`: Serve's `choose_replica` without a reservation)
and sends the request over HTTP itself (hop.py): Serve then takes the first
replica of the first rank and tells the router nothing, so the router remembers
that pick as it ranks it, and reads a replica's load from `inflight`, what this
process has sent to it and not yet had answered.
"""

from __future__ import annotations

import random
import time
from collections import Counter, OrderedDict
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from .placement import Candidate, ranked
from .wire import Forwarded

MAX_PREFIXES = 100_000
HELD_S = 600.0  # how long a replica is taken to hold a prefix it was sent
STEERING_WINDOW_S = 10.0
PICKED = "picked"  # a keyword of a pick-only `choose_replica`: the first of the first rank
PICK: dict[str, Any] = {"_reserve": False, PICKED: True}  # choose_replica's, for the hop
# requests this process has in flight to each replica (by its unique id), over the hop
inflight: Counter[str] = Counter()


def _forwarded(pending: PendingRequest | None) -> Forwarded | None:
    if pending is None or not pending.args:
        return None
    found = pending.args[0]
    return found if isinstance(found, Forwarded) else None


class SteeringRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        # prefix hash -> the replicas it was sent to -> when
        self._held: OrderedDict[str, dict[str, float]] = OrderedDict()
        self._steering: dict[str, dict[str, float]] = {}  # replica -> steering hash -> when
        self._rng = random.Random()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        forwarded = _forwarded(pending_request)
        if forwarded is not None and forwarded.replica is not None:
            named = by_id.get(forwarded.replica)
            if named is not None:
                return [[named]]
            forwarded = None
        if forwarded is not None and forwarded.avoid:
            by_id = {n: r for n, r in by_id.items() if n not in forwarded.avoid} or by_id
        candidates = [self._candidate(name, r, forwarded) for name, r in by_id.items()]
        ranks = [[by_id[name] for name in rank] for rank in ranked(candidates, self._rng)]
        picked = pending_request is not None and pending_request.kwargs.get(PICKED)
        if picked and forwarded is not None and ranks:
            self._remember(forwarded, ranks[0][0].replica_id.unique_id)
        return ranks

    def _candidate(
        self, name: str, replica: RunningReplica, forwarded: Forwarded | None
    ) -> Candidate:
        load = max(self.replica_queue_len_cache.get(replica.replica_id) or 0, inflight[name])
        if forwarded is None:
            return Candidate(name, load)
        now, held = time.monotonic(), 0
        for depth, piece in enumerate(forwarded.affinity.prefix, start=1):
            sent = self._held.get(piece, {}).get(name)
            if sent is not None and now - sent < HELD_S:
                held = depth
        steering = forwarded.affinity.steering
        when = self._steering.get(name, {}).get(steering) if steering else None
        recent = when is not None and now - when < STEERING_WINDOW_S
        return Candidate(name, load, held, recent)

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        forwarded = _forwarded(pending_request)
        if forwarded is not None:
            self._remember(forwarded, replica_id.unique_id)

    def _remember(self, forwarded: Forwarded, name: str) -> None:
        now = time.monotonic()
        for piece in forwarded.affinity.prefix:
            self._held.setdefault(piece, {})[name] = now
            self._held.move_to_end(piece)
        while len(self._held) > MAX_PREFIXES:
            self._held.popitem(last=False)
        if forwarded.affinity.steering:
            self._steering.setdefault(name, {})[forwarded.affinity.steering] = now
