"""The live-event bus behind GET /api/events (events.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

from miserver import request_context
from miserver.events import EventBus, LogEvents
from miserver.serving.telemetry import Meter


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


def test_log_and_telemetry_events_name_the_request() -> None:
    """LOC-EVENTS-26: a `log` event and a `token`/`done` event carry the `request_id` they
    were made for (the response's x-request-id), null outside a request."""
    logger = logging.getLogger("miserver.tests.events")

    async def scenario() -> list[tuple[str, object]]:
        bus = EventBus()
        handler = LogEvents(bus)
        logger.addHandler(handler)
        try:
            async with bus.subscribe() as queue:
                logger.warning("outside")
                with request_context.bound("trace-7"):
                    logger.warning("inside")
                    meter = Meter(emit=bus.publish, steps=1, n_prompt=3)
                worker = threading.Thread(target=lambda: (meter.token(0.01), meter.done(False)))
                worker.start()
                worker.join()
                events = [await queue.get() for _ in range(4)]
        finally:
            logger.removeHandler(handler)
        return [(e.name, e.data["request_id"]) for e in events]

    assert asyncio.run(scenario()) == [
        ("log", None),
        ("log", "trace-7"),
        ("token", "trace-7"),
        ("done", "trace-7"),
    ]
