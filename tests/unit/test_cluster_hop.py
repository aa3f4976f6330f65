"""The hop from the ingress to an engine replica's port (cluster/hop.py) and the router's
pick-only path (cluster/router.py), without a Ray cluster: the router is Serve's class,
given stand-ins for the replicas it ranks (tests/e2e/test_cluster.py runs both for real).

Issue 49 items 3 and 4: what the ingress stamped reaches the replica only with the
cluster's key; the router remembers the replica it picked for a prefix and passes over
one an earlier try lost."""

from __future__ import annotations

from dataclasses import dataclass

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from miserver.cluster import hop
from miserver.cluster.affinity import affinity
from miserver.cluster.router import PICKED, SteeringRouter, inflight
from miserver.cluster.wire import Forwarded

KEY = b"k" * 43


def test_a_stamp_holds_only_with_the_clusters_key() -> None:
    """A request to a replica's port without the key, or with another, is not admitted."""
    sent = [(b"content-type", b"application/json"), (hop.STAMP, b"7")]
    assert hop.admitted(sent, KEY) is None
    assert hop.admitted([*sent, (hop.KEY, b"x" * 43)], KEY) is None
    assert hop.admitted([*sent, (hop.KEY, b"")], KEY) is None


def test_the_stamp_is_read_and_the_internal_headers_are_dropped() -> None:
    headers = [
        (b"Host", b"10.0.0.2:4711"),
        (b"Content-Type", b"application/json"),
        (b"X-miLLM-Cluster-Key", KEY),
        (b"X-miLLM-Admitted-Epoch", b"12"),
        (b"X-miLLM-Background", b"1"),
        (b"x-request-id", b"req_1"),
    ]
    found = hop.admitted(headers, KEY)
    assert found is not None
    assert (found.epoch, found.background) == (12, True)
    assert found.headers == ((b"Content-Type", b"application/json"), (b"x-request-id", b"req_1"))
    other = hop.admitted([(hop.KEY, KEY), (hop.STAMP, b"not a number")], KEY)
    assert other is not None and (other.epoch, other.background) == (0, False)


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass(frozen=True)
class _Replica:
    """What the router reads of a Serve replica."""

    replica_id: _Id


def _router() -> SteeringRouter:
    router = object.__new__(SteeringRouter)  # Serve's constructor wants a live deployment
    router.initialize_state()
    router._replica_queue_len_cache = _NoQueues()  # Serve probes none on the pick-only path
    return router


class _NoQueues:
    def get(self, replica_id: object) -> None:
        return None


def _pending(forwarded: Forwarded, *, picked: bool) -> PendingRequest:
    metadata = RequestMetadata(request_id="r", internal_request_id="r")
    return PendingRequest(
        args=[forwarded], kwargs={PICKED: True} if picked else {}, metadata=metadata
    )


def _chat(*turns: str, avoid: frozenset[str] = frozenset()) -> Forwarded:
    body = {"model": "m", "messages": [{"role": "user", "content": t} for t in turns]}
    return Forwarded(
        "POST", "/v1/chat/completions", b"", (), b"", 0, affinity=affinity(body), avoid=avoid
    )


async def _first(
    router: SteeringRouter, replicas: list[_Replica], forwarded: Forwarded, **kw: bool
) -> str:
    ranks = await router.choose_replicas(replicas, _pending(forwarded, **kw))  # type: ignore[arg-type]
    return str(ranks[0][0].replica_id.unique_id)


async def test_a_pick_is_remembered_so_the_next_turn_follows_it() -> None:
    """On the pick-only path Serve tells the router nothing after it picks, so the router
    remembers the first of its first rank itself: the second turn ranks that replica
    first, whatever the draw."""
    replicas = [_Replica(_Id(name)) for name in ("a", "b", "c", "d")]
    for _ in range(20):
        router = _router()
        held = await _first(router, replicas, _chat("hello"), picked=True)
        assert await _first(router, replicas, _chat("hello", "and then?"), picked=True) == held


async def test_without_the_pick_keyword_nothing_is_remembered_at_ranking() -> None:
    """The handle path (Serve dispatches, then calls on_request_routed) is not double
    counted: ranking alone remembers nothing."""
    replicas = [_Replica(_Id(name)) for name in ("a", "b")]
    router = _router()
    await _first(router, replicas, _chat("hello"), picked=False)
    assert not router._held


async def test_a_replica_lost_on_an_earlier_try_is_passed_over_while_another_lives() -> None:
    replicas = [_Replica(_Id(name)) for name in ("a", "b")]
    for _ in range(20):
        assert (
            await _first(_router(), replicas, _chat("x", avoid=frozenset({"a"})), picked=True)
            == "b"
        )
    assert (
        await _first(_router(), replicas[:1], _chat("x", avoid=frozenset({"a"})), picked=True)
        == "a"
    )


async def test_the_load_is_what_this_process_has_in_flight_to_each() -> None:
    """Without affinity, the two choices take the replica with fewer requests in flight
    over the hop (Serve's queue lengths are not probed on the pick-only path)."""
    replicas = [_Replica(_Id(name)) for name in ("busy", "idle")]
    inflight["busy"] += 3
    try:
        for _ in range(20):
            empty = Forwarded("GET", "/health", b"", (), b"", 0)
            assert await _first(_router(), replicas, empty, picked=True) == "idle"
    finally:
        inflight["busy"] -= 3
