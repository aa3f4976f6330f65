"""The generation slot and its queue."""

from __future__ import annotations

import asyncio

import pytest

from miserver.errors import ApiError
from miserver.serving.scheduler import Scheduler, Ticket, in_background


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


def granted(*tickets: Ticket) -> list[bool]:
    return [t.granted.done() for t in tickets]


def test_rows_share_the_slot_up_to_the_batch() -> None:
    """OAI-CBM-02: with a batch of three rows, three shared requests hold the slot at once;
    the fourth waits for a row to end."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=4, retry_after=1, rows=lambda: 3)
        rows = [scheduler.enter(shared=True) for _ in range(4)]
        assert granted(*rows) == [True, True, True, False]
        assert scheduler.in_use == 3 and scheduler.waiting == 1
        scheduler.leave(rows[1])
        assert granted(rows[3]) == [True]
        for row in rows:
            scheduler.leave(row)
        assert not scheduler.busy

    asyncio.run(scenario())


def test_an_exclusive_request_waits_for_the_rows_and_holds_later_rows_back() -> None:
    """OAI-CBM-03..12 (the serial path): a request that must run alone waits until the rows
    end; a row that comes after it waits behind it, so it is never starved."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=4, retry_after=1, rows=lambda: 4)
        first, second = scheduler.enter(shared=True), scheduler.enter(shared=True)
        alone = scheduler.enter()
        later = scheduler.enter(shared=True)
        assert granted(first, second, alone, later) == [True, True, False, False]
        scheduler.leave(first)
        assert granted(alone, later) == [False, False]
        scheduler.leave(second)
        assert granted(alone, later) == [True, False]
        scheduler.leave(alone)
        assert granted(later) == [True]
        scheduler.leave(later)

    asyncio.run(scenario())


def test_an_exclusive_waiter_that_leaves_lets_the_rows_in() -> None:
    """OAI-CBM-02: rows held back behind a serial request go in as soon as it gives up."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=4, retry_after=1, rows=lambda: 2)
        row = scheduler.enter(shared=True)
        alone = scheduler.enter()
        behind = scheduler.enter(shared=True)
        scheduler.leave(alone)
        assert granted(behind) == [True]
        for ticket in (row, behind):
            scheduler.leave(ticket)

    asyncio.run(scenario())


def test_cancel_and_halt_reach_every_row() -> None:
    """LOC-CANCEL-01: POST /api/cancel, and a model switch, stop every row of the batch."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=4, retry_after=1, rows=lambda: 2)
        rows = [scheduler.enter(shared=True) for _ in range(2)]
        assert scheduler.cancel_holder()
        scheduler.halt_holder()
        assert all(r.cancel.is_set() and r.halt.is_set() for r in rows)

    asyncio.run(scenario())


def test_background_lines_wait_behind_interactive_requests_and_are_preempted() -> None:
    """Issue 50 item 3 (contract 0.31.0): a Batch API line asks in the background. Lines may
    take every row and wait behind every interactive waiter; they are never refused for a
    full queue, and `POST /api/cancel` leaves them alone. An interactive row request that
    finds no row halts the line granted last (marked preempted) and takes its place at
    once; when no line is left to halt, it waits, and gets the next row before any line."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=1, retry_after=1, rows=lambda: 2)
        marks = []
        lines = []
        for _ in range(3):
            with in_background() as mark:
                lines.append(scheduler.enter(shared=True))
            marks.append(mark)
        assert [t.granted.done() for t in lines] == [True, True, False]
        assert scheduler.refusal() is None and not any(t.halt.is_set() for t in lines)
        first = scheduler.enter(shared=True)  # no row: the line granted last is halted
        assert first.granted.done() and first.background is None
        assert [t.halt.is_set() for t in lines] == [False, True, False]
        assert [m.preempted for m in marks] == [0, 1, 0]
        second = scheduler.enter(shared=True)  # the other line halted too
        assert second.granted.done() and lines[0].halt.is_set()
        third = scheduler.enter(shared=True)  # nothing left to halt: it waits
        assert not third.granted.done()
        with pytest.raises(ApiError):
            scheduler.enter(shared=True)  # the interactive queue (1) is full
        scheduler.leave(lines[0])
        scheduler.leave(lines[1])
        assert not third.granted.done() and not lines[2].granted.done()
        assert scheduler.cancel_holder() and first.cancel.is_set()
        assert not any(t.cancel.is_set() for t in lines)
        scheduler.leave(first)
        assert third.granted.done() and not lines[2].granted.done()
        scheduler.leave(second)
        assert lines[2].granted.done()

    asyncio.run(scenario())


def test_a_request_needing_the_slot_alone_halts_every_background_row() -> None:
    """Issue 50: with one row (the serial path), or for a request that needs the slot alone,
    every background holder is halted; the interactive request is let in first."""

    async def scenario() -> None:
        scheduler = Scheduler(max_waiting=4, retry_after=1)
        with in_background() as mark:
            line = scheduler.enter()
            later = scheduler.enter()
        assert line.granted.done() and not later.granted.done()
        interactive = scheduler.enter()
        assert line.halt.is_set() and mark.preempted == 1 and not later.halt.is_set()
        scheduler.leave(line)
        assert interactive.granted.done() and not later.granted.done()
        scheduler.leave(interactive)
        assert later.granted.done()

    asyncio.run(scenario())
