"""Requests on their way to a batch (serving/arrivals.py, issue 43): an idle batch waits
until it has gathered enough (here: none is on its way), a bounded time, and for nothing
when it has."""

from __future__ import annotations

import asyncio
import time

from miserver.serving.arrivals import Arrivals


async def test_nothing_on_its_way_means_no_wait() -> None:
    arrivals = Arrivals()
    started = time.monotonic()
    await arrivals.gathered(lambda: arrivals.coming == 0, within=1.0)
    assert time.monotonic() - started < 0.05


async def test_an_idle_batch_waits_until_the_request_on_its_way_joins() -> None:
    arrivals = Arrivals()
    joined: list[str] = []

    async def request(delay: float) -> None:
        with arrivals.arriving():
            await asyncio.sleep(delay)
            joined.append("joined")
            arrivals.joined()
            await asyncio.sleep(0.2)  # the rest of its reply: no longer on its way
        assert arrivals.coming >= 0

    task = asyncio.create_task(request(0.05))
    await asyncio.sleep(0)
    assert arrivals.coming == 1
    started = time.monotonic()
    await arrivals.gathered(lambda: arrivals.coming == 0, within=1.0)
    waited = time.monotonic() - started
    assert joined == ["joined"] and arrivals.coming == 0 and 0.03 < waited < 0.15
    await task
    assert arrivals.coming == 0  # settled once, not again at the end of its block


async def test_the_wait_is_bounded_and_ends_once_enough_came() -> None:
    arrivals = Arrivals()
    with arrivals.arriving():  # on its way, never joining
        started = time.monotonic()
        await arrivals.gathered(lambda: False, within=0.05)
        assert 0.04 < time.monotonic() - started < 0.15
        started = time.monotonic()
        await arrivals.gathered(lambda: True, within=1.0)
        assert time.monotonic() - started < 0.05
    assert arrivals.coming == 0
