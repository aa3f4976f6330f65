"""The generation slot and its queue (docs/DECISIONS.md, scheduling and backpressure).

The slot is held one of two ways. Exclusive: one request alone (a serial
generation, scoring, a decision, a load). Shared: a row of the resident
engine's batch (continuous batching, docs/DECISIONS.md), up to `rows` at once
and never beside an exclusive holder. Requests are let in in arrival order: a
shared one is let in while rows are free and no exclusive one waits ahead of
it, so an exclusive request is never starved by a stream of rows. Past
`max_waiting` waiting requests the next is refused with 503 queue_full. A
waiter that gives up (client gone) leaves the queue at once; a holder gives
the slot back when its work has really stopped.

Batch API lines (serving/batches) ask in the background (`in_background`): a
background request waits behind every interactive one, is never refused for a
full queue (its runner bounds how many wait) and is not stopped by `POST
/api/cancel`. It may take every row, but it is preempted: an interactive row
request that finds none free halts the background row granted last (the least
work lost) and is granted at once, for a halted background row no longer
counts; the batch drops that row (`503 preempted` for its line) before it
admits the newcomer. A request that needs the slot alone halts every
background holder and waits for them to leave. The line's runner asks again,
behind the interactive requests (its `Background` mark tells a preemption
from a model switch, which halts every holder). So an interactive request
arriving while a batch runs waits for no row (docs/DECISIONS.md, "Contract
0.31.0").

Holding it is one `async with`: `scheduler.hold()` for work on whatever is
resident (a decision, a load, an unload), `holding(manager, scheduler, entry,
...)` for work that needs one model resident (a completion, scoring,
embeddings), which switches models first when needed. A stream, whose body
runs after its handler returned, holds a `Lease` instead.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..engines.base import Engine
from ..errors import ApiError
from ..models.manager import ModelManager
from ..models.registry import ModelEntry


@dataclass(eq=False, slots=True)
class Background:
    """A background request's mark: how many times its row was taken back."""

    preempted: int = 0


_background: ContextVar[Background | None] = ContextVar("miserver_background", default=None)


@contextmanager
def in_background() -> Iterator[Background]:
    """Every place in line taken while the block runs (in this task and the tasks it starts)
    is a background one (a Batch API line's), marked on the `Background` yielded when
    preempted."""
    mark = Background()
    token = _background.set(mark)
    try:
        yield mark
    finally:
        _background.reset(token)


def backgrounded() -> bool:
    """Whether this code runs `in_background` (a cluster sends the mark on with a line)."""
    return _background.get() is not None


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place: waiting, then holding the slot, then done."""

    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    shared: bool = False  # a row of the batch, beside other rows
    background: Background | None = None  # a Batch API line's: after interactive requests
    released: bool = False
    order: int = 0  # when it was granted (the background row granted last is preempted)
    halt: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)


class Scheduler:
    def __init__(
        self, max_waiting: int, retry_after: int, rows: Callable[[], int] = lambda: 1
    ) -> None:
        self._max_waiting = max_waiting
        self._retry_after = retry_after
        self._holders: set[Ticket] = set()
        self._waiting: deque[Ticket] = deque()  # interactive requests, in arrival order
        self._behind: deque[Ticket] = deque()  # background ones, in arrival order
        self._rows = rows  # the resident engine's batch rows, asked at each grant
        self._granted = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._behind)

    @property
    def busy(self) -> bool:
        return bool(self._holders)

    @property
    def in_use(self) -> int:
        """How many requests hold the slot now (rows of the batch, or the one alone)."""
        return len(self._holders)

    @property
    def rows(self) -> int:
        """How many shared holders at most: the resident engine's batch rows (1: serial)."""
        return max(1, self._rows())

    def refusal(self) -> ApiError | None:
        """503 queue_full when the queue is full now: a new request would be refused."""
        return self._full() if len(self._waiting) >= self._max_waiting else None

    def _full(self) -> ApiError:
        return ApiError(
            "queue_full",
            f"The request queue is full ({self._max_waiting} waiting); retry later.",
            headers={"Retry-After": str(self._retry_after)},
        )

    def enter(self, *, front: bool = False, shared: bool = False) -> Ticket:
        """A place in line (granted at once when it may hold now); 503 when the queue is full.

        `front` puts a model switch ahead of the waiters: they would need the
        old model, which is about to go. `shared` asks for a row of the batch.
        A place taken `in_background` waits behind every interactive one.
        """
        ticket = Ticket(shared=shared, background=_background.get())
        line = self._waiting if ticket.background is None else self._behind
        ahead = bool(self._waiting) or (ticket.background is not None and bool(self._behind))
        if ticket.background is None and not self._may_hold(ticket):
            self._preempt(ticket)
        if (front or not ahead) and self._may_hold(ticket):
            self._grant(ticket)
            return ticket
        refused = None if ticket.background else self.refusal()
        if refused is not None:
            raise refused
        if front:
            line.appendleft(ticket)
        else:
            line.append(ticket)
        return ticket

    def _preempt(self, waiter: Ticket) -> None:
        """Halt background work for an interactive `waiter` that cannot hold: the background
        row granted last (the least work lost), whose row the waiter may take at once (the
        batch drops a halted row before it admits one); every background holder for a
        waiter that needs the slot alone, which waits for them to leave."""
        running = [h for h in self._holders if h.background is not None and not h.halt.is_set()]
        chosen = running if not waiter.shared else sorted(running, key=lambda h: -h.order)[:1]
        for holder in chosen:
            assert holder.background is not None
            holder.background.preempted += 1
            holder.halt.set()

    def _may_hold(self, ticket: Ticket) -> bool:
        if not ticket.shared:
            return not self._holders
        halted = sum(1 for h in self._holders if h.background is not None and h.halt.is_set())
        return len(self._holders) - halted < self.rows and all(h.shared for h in self._holders)

    def _grant(self, ticket: Ticket) -> None:
        self._granted += 1
        ticket.order = self._granted
        self._holders.add(ticket)
        ticket.granted.set_result(None)

    async def wait(self, ticket: Ticket, timeout: float | None = None) -> bool:
        """Wait for the slot up to `timeout` seconds, keeping the place in line."""
        if ticket.granted.done():
            return True
        done, _ = await asyncio.wait({ticket.granted}, timeout=timeout)
        return bool(done)

    def halt_holder(self) -> None:
        """Ask every request holding the slot to stop at its next token."""
        for holder in self._holders:
            holder.halt.set()

    def cancel_holder(self) -> bool:
        """`POST /api/cancel`: ask the interactive work holding the slot (every row) to stop;
        False if none holds it. A Batch API line is cancelled with its batch."""
        interactive = [holder for holder in self._holders if holder.background is None]
        for holder in interactive:
            holder.cancel.set()
        return bool(interactive)

    @asynccontextmanager
    async def hold(self, *, front: bool = False) -> AsyncIterator[Ticket]:
        """The slot for the block: waited for in line (`front`: ahead of the waiters), given
        back when the block ends, however it ends."""
        ticket = self.enter(front=front)
        try:
            await self.wait(ticket)
            yield ticket
        finally:
            self.leave(ticket)

    def leave(self, ticket: Ticket) -> None:
        """Give up the place or the slot; idempotent."""
        if ticket.released:
            return
        ticket.released = True
        if ticket in self._holders:
            self._holders.discard(ticket)
            self._grant_next()
        else:
            for line in (self._waiting, self._behind):
                if ticket in line:
                    line.remove(ticket)
            self._grant_next()  # an exclusive waiter that left may have held rows back

    def _grant_next(self) -> None:
        """Let in the waiters at the head of the line that may hold now, in order: the
        interactive ones, then (none waiting) the background ones."""
        for line in (self._waiting, self._behind):
            while line:
                ticket = line[0]
                if ticket.granted.done():  # cancelled while waiting
                    line.popleft()
                    continue
                if not self._may_hold(ticket):
                    return
                line.popleft()
                self._grant(ticket)


@dataclass(frozen=True, slots=True)
class Slot:
    """The slot held with a model resident: the holder's ticket and the model's engine."""

    ticket: Ticket
    engine: Engine


async def claim(
    manager: ModelManager,
    scheduler: Scheduler,
    entry: ModelEntry,
    switch_timeout: float,
    *,
    shared: bool = False,
) -> Slot:
    """Hold the slot with `entry` resident, switching models first if needed; the caller
    gives the ticket back (`holding` does it for a block).

    A switch is checked (quantization, memory) before it begins, goes ahead
    of the queue, and waits for the running request up to `switch_timeout`
    seconds (GRACEFUL_UNLOAD_TIMEOUT) before halting it.
    """
    switch = manager.engine_if_resident(entry) is None
    if switch:
        manager.check_loadable(entry)
    ticket = scheduler.enter(front=switch, shared=shared and not switch)
    try:
        if switch:
            manager.begin_switch(entry)
            if not await scheduler.wait(ticket, switch_timeout):
                scheduler.halt_holder()
        await scheduler.wait(ticket)
        return await granted(manager, scheduler, ticket, entry, switch_timeout)
    except BaseException:
        manager.abort_switch(entry)
        scheduler.leave(ticket)
        raise


async def granted(
    manager: ModelManager,
    scheduler: Scheduler,
    ticket: Ticket,
    entry: ModelEntry,
    switch_timeout: float,
) -> Slot:
    """The slot for a ticket just granted, with `entry` resident. A row whose model went
    while it waited gives its place back and claims the slot alone, which loads it: a row
    never loads a model beside other rows."""
    if ticket.shared and manager.engine_if_resident(entry) is None:
        scheduler.leave(ticket)
        return await claim(manager, scheduler, entry, switch_timeout)
    return Slot(ticket, await manager.ensure(entry))


@asynccontextmanager
async def holding(
    manager: ModelManager,
    scheduler: Scheduler,
    entry: ModelEntry,
    switch_timeout: float,
    *,
    shared: bool = False,
) -> AsyncIterator[Slot]:
    """`claim` for the block: the slot is given back when it ends, however it ends."""
    slot = await claim(manager, scheduler, entry, switch_timeout, shared=shared)
    try:
        yield slot
    finally:
        scheduler.leave(slot.ticket)


class Lease:
    """A stream's place in line or hold on the slot, taken before its 200 and given back
    once, however the stream ends: by the stream itself (`release`, idempotent), at once
    when what follows the taking fails (`released_on_error`), or when the stream is
    collected with its body never started, the client gone first (`bind`)."""

    def __init__(self, scheduler: Scheduler, ticket: Ticket) -> None:
        self._scheduler = scheduler
        self._ticket = ticket

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait for the slot up to `timeout` seconds, keeping the place in line."""
        return await self._scheduler.wait(self._ticket, timeout)

    async def slot(self, manager: ModelManager, entry: ModelEntry, switch_timeout: float) -> Slot:
        """The slot, once granted, with `entry` resident (a row whose model went while it
        waited claims the slot alone: the lease then holds that ticket)."""
        slot = await granted(manager, self._scheduler, self._ticket, entry, switch_timeout)
        self._ticket = slot.ticket
        return slot

    def release(self) -> None:
        self._scheduler.leave(self._ticket)

    @contextmanager
    def released_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.release()
            raise

    def bind(self, stream: object) -> None:
        """Release once `stream` is collected (from the loop's thread, wherever that runs)."""
        loop = asyncio.get_running_loop()
        weakref.finalize(stream, loop.call_soon_threadsafe, self.release)
