"""The cluster's parts that run without Ray (issue 49 items 3, 5 and 6): the control's
event relay, the proxy's request-id fix, and the simulation's verdict."""

from __future__ import annotations

import asyncio
import time

import pytest

from miserver.cluster import relay
from miserver.cluster.proxy import first_id_only
from tools.bench import cluster_sim


async def test_listeners_get_every_replicas_events_in_order() -> None:
    """Item 3: replicas publish, a listener long-polls what came after its mark."""
    events = relay.Events()
    assert not events.listening()
    seq, found = await events.after("l1", None)
    assert found == [] and events.listening()
    assert await events.publish([("token", {"a": 1})]) is True
    assert await events.publish([("done", {"b": 2}), ("state", {"c": 3})]) is True
    seq, found = await events.after("l1", seq, 0.1)
    assert [name for name, _ in found] == ["token", "done", "state"]
    started = time.monotonic()
    later, nothing = await events.after("l1", seq, 0.2)
    assert nothing == [] and later == seq and time.monotonic() - started >= 0.19
    events.leave("l1")
    assert not events.listening()


async def test_a_long_poll_wakes_when_an_event_comes() -> None:
    events = relay.Events()
    seq, _ = await events.after("l", None)
    waiting = asyncio.create_task(events.after("l", seq, 10.0))
    await asyncio.sleep(0.05)
    await events.publish([("token", {})])
    _, found = await asyncio.wait_for(waiting, 1.0)
    assert found == [("token", {})]


async def test_replicas_hear_when_the_first_listener_comes() -> None:
    events = relay.Events()
    waiting = asyncio.create_task(events.wait_listening())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await events.after("l", None)
    assert await asyncio.wait_for(waiting, 1.0) is True


def test_the_proxy_keeps_the_ingresss_request_id() -> None:
    """Serve's proxy appends its own X-Request-ID; the first (the ingress's) is kept."""
    headers = [
        (b"content-type", b"application/json"),
        (b"x-request-id", b"req_1"),
        (b"X-Request-ID", b"raw id"),
    ]
    assert first_id_only(headers) == headers[:2]
    assert first_id_only(headers[:1]) == headers[:1]


@pytest.mark.parametrize("sets", [8, 64])
def test_the_simulation_prefers_affinity_as_steering_sets_grow(sets: int) -> None:
    """Item 6: with several steering sets, keeping a set's rows together beats spreading
    them (the simulation on the measured service times, deterministic for its seed)."""
    parsed = cluster_sim.parser().parse_args(
        ["--replicas", "8", "--sets", str(sets), "--seconds", "60"]
    )
    rows = {
        row["router"]: row
        for row in cluster_sim.simulate(parsed, cluster_sim.Times.read(cluster_sim.MEASURED))
    }
    assert rows["affinity"]["goodput"] > rows["two-choices"]["goodput"]
    assert rows["affinity"]["p50"] < rows["two-choices"]["p50"]
    assert rows["affinity"]["cached"] > rows["round-robin"]["cached"]
