"""The generation slot and its queue."""

from __future__ import annotations

import asyncio

import pytest

from miserver.errors import ApiError
from miserver.serving.scheduler import Scheduler


def test_waiters_are_served_in_arrival_order() -> None:
    """DECISIONS scheduling: one slot; waiting requests queue in arrival order."""

    async def scenario() -> list[int]:
        scheduler = Scheduler(max_waiting=4, retry_after=1)
        order: list[int] = []
        first = scheduler.enter()
        tickets = [scheduler.enter() for _ in range(3)]

        async def run(i: int) -> None:
            await scheduler.wait(tickets[i])
            order.append(i)
            scheduler.leave(tickets[i])

        tasks = [asyncio.create_task(run(i)) for i in (2, 0, 1)]
        await asyncio.sleep(0)
        scheduler.leave(first)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_queue_full_past_the_limit() -> None:
    """OAI-ERR-09: past QUEUE_MAX_WAITING the next request gets 503 queue_full with Retry-After."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=2, retry_after=3)
        scheduler.enter()
        scheduler.enter()
        scheduler.enter()
        with pytest.raises(ApiError) as info:
            scheduler.enter()
        assert info.value.status == 503 and info.value.code == "queue_full"
        assert info.value.headers["Retry-After"] == "3"

    asyncio.run(scenario())


def test_a_waiter_that_leaves_gives_up_its_place() -> None:
    """DECISIONS scheduling: a client that disconnects gives up its place at once."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=1, retry_after=1)
        holder = scheduler.enter()
        waiter = scheduler.enter()
        assert not await scheduler.wait(waiter, timeout=0.01)
        scheduler.leave(waiter)
        assert scheduler.waiting == 0
        nxt = scheduler.enter()
        scheduler.leave(holder)
        assert await scheduler.wait(nxt, timeout=1)
        scheduler.leave(nxt)
        scheduler.leave(nxt)
        assert not scheduler.busy

    asyncio.run(scenario())
