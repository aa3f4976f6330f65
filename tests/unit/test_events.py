"""The live-event bus behind GET /api/events (serving/events.py)."""

from __future__ import annotations

import asyncio
import threading

from miserver.serving.events import EventBus


def test_events_reach_every_listener_from_any_thread() -> None:
    """LOC-EVENTS-05, -06: events published on the loop or from a worker thread arrive."""

    async def scenario() -> list[str]:
        bus = EventBus()
        assert not bus.listening
        bus.publish("state", {})  # nobody listens: dropped, no error
        async with bus.subscribe() as first, bus.subscribe() as second:
            assert bus.listening
            bus.publish("state", {"n": 1})
            worker = threading.Thread(target=bus.publish, args=("token", {"step": 1}))
            worker.start()
            worker.join()
            got = [(await first.get()).name, (await first.get()).name]
            assert [(await second.get()).name, (await second.get()).name] == got
        assert not bus.listening
        return got

    assert asyncio.run(scenario()) == ["state", "token"]


def test_a_slow_listener_loses_its_oldest_events() -> None:
    """LOC-EVENTS-06: a listener that falls behind never blocks the publisher."""

    async def scenario() -> list[int]:
        bus = EventBus(max_queue=3)
        async with bus.subscribe() as queue:
            for step in range(10):
                bus.publish("token", {"step": step})
            return [(await queue.get()).data["step"] for _ in range(3)]

    assert asyncio.run(scenario()) == [7, 8, 9]
