"""Continuous batching: the choices of many requests decoded together (docs/DECISIONS.md).

A `Batcher` drives one engine's `Batch`. A choice joins at the next step
and leaves when it ends (EOS, its budget, a stop string, a cancel, a closed
client); the others keep decoding. Each step is one job on the engine's
worker thread, so work that needs the engine between steps (a load, a
decision, a serial request) waits for one step, not for the batch.

Before a step, the choices that joined since the last one take their rows
(`Batch.join_all`, `_admit`); when no row was decoding they are prefilled
there, together where the engine can, and their first tokens delivered. A
step (`_step`) then feeds every ready row's newest token in one forward pass
and takes each one's next; an engine that prefills in chunks (llama.cpp)
runs the next chunk of a row that joined while others decoded in the same
step, and that row's first token comes with the step its prompt ends in. A
step's events reach their readers together once it is over. Each row's tokens go through the
same `ChoiceText` as on the serial path, so a choice's text, stop strings
and finish reason are the same either way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ...engines.base import Batch, BatchRow, Engine, Joiner
from ..arrivals import GATHER_S, Arrivals
from ..scheduler import Ticket
from .generation import (
    ChoiceEnd,
    ChoiceEvent,
    ChoiceFailed,
    ChoiceJob,
    ChoiceText,
    Inbox,
    TextDelta,
    choice_events,
    delivered,
    ended,
    halted_reason,
)

log = logging.getLogger(__name__)

BURST_S = 0.1  # the longest job of steps that deliver nothing (`Batcher._steps`)
BACKGROUND_CHUNK = 16  # prompt tokens a step of Batch API rows' prefill, beside decoding rows


@dataclass(eq=False, slots=True, kw_only=True)
class _Member:
    """One choice in the batch: its job, its text so far, where its events go."""

    job: ChoiceJob
    text: ChoiceText
    emit: Callable[[ChoiceEvent], None]
    cancel: threading.Event
    row: BatchRow | None = None
    ended: bool = False
    waited: float = 0.0  # seconds of the steps that prefilled its row, before it was ready

    def end(self, event: ChoiceEnd | ChoiceFailed) -> None:
        self.ended = True
        ended(self.job, event, self.emit)


@dataclass(slots=True)
class Progress:
    """What operators see of the batch, at most once per `every` seconds: a `batch` event on
    /api/events (rows, tokens/s, steps) and a log line."""

    publish: Callable[[str, dict[str, Any]], None] | None = None
    every: float = 1.0
    _since: float = field(default_factory=time.monotonic)
    _tokens: int = 0
    _steps: int = 0

    def step(self, rows: int, tokens: int) -> None:
        self._tokens += tokens
        self._steps += 1
        now = time.monotonic()
        if now - self._since < self.every:
            return
        rate = self._tokens / (now - self._since)
        log.info("batch: %d rows, %.1f tok/s over %d steps", rows, rate, self._steps)
        if self.publish is not None:
            data = {"rows": rows, "tok_s": round(rate, 1), "steps": self._steps}
            self.publish("batch", data)
        self._since, self._tokens, self._steps = now, 0, 0


@dataclass(eq=False, slots=True)
class Batcher:
    """The rows of one engine's batch and the task that steps them."""

    engine: Engine
    batch: Batch
    executor: Executor
    progress: Progress = field(default_factory=Progress)
    arrivals: Arrivals = field(default_factory=Arrivals)
    _joining: list[_Member] = field(default_factory=list)
    _outbox: list[tuple[Inbox, ChoiceEvent]] = field(default_factory=list)
    _waking: set[Inbox] = field(default_factory=set)  # the inboxes with events in `_outbox`
    _rows: list[_Member] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _ended: int = 0  # rows that ended together in the step that left the batch idle
    _ended_at: float = 0.0  # when (time.monotonic())

    def events(self, job: ChoiceJob, pace: float = 0.0) -> AsyncIterator[TextDelta | ChoiceEnd]:
        """One choice decoded in the batch: its text pieces, then its end (as
        `generation.choice_events`, `pace` too). Closing the iterator takes the row out at
        the next step."""
        return delivered(self._queued(job, pace))

    def _queued(self, job: ChoiceJob, pace: float) -> AsyncGenerator[ChoiceEvent, None]:
        inbox = Inbox(pace)
        emit = partial(self._post, inbox)
        text = ChoiceText(self.engine, job, inbox.cancel, emit)
        self._joining.append(_Member(job=job, text=text, emit=emit, cancel=inbox.cancel))
        self.arrivals.joined()
        if self._task is None:
            self._task = asyncio.create_task(self._drive())
        return inbox.read()

    async def _drive(self) -> None:
        """Step while any row decodes or waits to join. Choices that joined are prefilled in
        one executor job and their first tokens delivered before the step, which is another:
        a new request's first token never waits for a step of the others."""
        loop = asyncio.get_running_loop()
        try:
            while self._joining or self._rows:
                if not self._rows:  # idle: those on their way join with these (arrivals.py)
                    await self.arrivals.gathered(self._gathered)
                joining, self._joining = self._joining, []
                try:
                    if joining:
                        await loop.run_in_executor(self.executor, self._admit, joining)
                        await self._deliver()
                    if self._rows:
                        await loop.run_in_executor(self.executor, self._steps, len(joining))
                except Exception as exc:  # the engine's fault: every row ends in an error
                    log.exception("batched generation failed")
                    self._fail([*joining, *self._rows], exc)
                await self._deliver()
        finally:
            self._task = None

    def _gathered(self) -> bool:
        """Whether an idle batch admits its joiners now: every row is asked for, or none is
        on its way and as many joined as rows ended together in the last step, if that was
        less than GATHER_S ago (their clients' next requests, sent at once)."""
        joining = len(self._joining)
        if joining >= self.batch.capacity:
            return True
        recent = time.monotonic() - self._ended_at < GATHER_S
        return self.arrivals.coming == 0 and joining >= (self._ended if recent else 0)

    def _post(self, inbox: Inbox, event: ChoiceEvent) -> None:
        """A row's event, on the engine's thread: a text piece that would not wake its
        reader yet (a paced stream's, `Inbox.hold`) waits in its inbox at once; any other
        waits until its step is over, and the steps stop there to deliver it (so are the
        pieces after it, in order)."""
        if inbox in self._waking or not inbox.hold(event):
            self._outbox.append((inbox, event))
            self._waking.add(inbox)

    async def _deliver(self) -> None:
        """The step's events to their readers, in one go on the event loop's thread, and
        their readers run before the next step starts: the loop wakes once per step, and
        its work never competes with the engine's threads for the cores."""
        outbox, self._outbox = self._outbox, []
        self._waking.clear()
        for inbox, event in outbox:
            inbox.put(event)
        if outbox:
            await asyncio.sleep(0)

    def _admit(self, joining: list[_Member]) -> None:
        """Blocking, on the engine's thread: prefill each choice that joined, take its first
        token."""
        self._drop_cancelled()  # a client that left frees its row before anyone takes it
        started = time.perf_counter()
        live = []
        for member in joining:
            if member.cancel.is_set():  # the client left before its turn
                member.end(ChoiceEnd("cancelled", 0, 0))
            elif _halted(member):  # preempted (scheduler.py) before its turn
                member.end(ChoiceEnd(halted_reason(member.job), 0, 0))
            else:
                live.append(member)
        if not live:
            return
        joiners = [Joiner(m.job.prompt_ids, m.job.params, m.job.rng, m.job.hooks) for m in live]
        for member, row in zip(live, self.batch.join_all(joiners), strict=True):
            self._joined(member, row, started)

    def _steps(self, joined: int) -> None:
        """Blocking, on the engine's thread: one step, then more in the same job while nothing
        needs the event loop (BURST_S at most): no event to deliver (a JSON row's text comes
        at its end, a paced stream's when its reader is due one), no choice waiting to join,
        a row still decoding. One client's JSON reply then wakes the loop about once a
        BURST_S, and a stream's once its pace, not once a token, and the loop's work stops
        competing with the forward pass for the cores; a joiner waits one step as before,
        and work queued for the engine (scoring) BURST_S at most."""
        self._step(joined)
        deadline = time.perf_counter() + BURST_S
        while self._rows and not self._outbox and not self._joining:
            if time.perf_counter() >= deadline:
                return
            self._step(0)

    def _step(self, joined: int) -> None:
        """Blocking, on the engine's thread: one token for every row (`joined`: first tokens
        taken since the last step, for the progress figures)."""
        self._drop_cancelled()
        if not self._rows:
            return
        started = time.perf_counter()
        decode = not self._yielding()
        sat_out = set() if decode else {id(m) for m in self._rows if m.row and m.row.ready}
        rows = [m.row for m in self._rows if m.row is not None]
        self.batch.step(rows, decode=decode, cap=self._cap())
        elapsed = time.perf_counter() - started
        made = 0
        for member in self._rows:
            assert member.row is not None
            if id(member) in sat_out:  # a background row that let an interactive one in
                continue
            if member.row.ready:  # a token this step: its next, or the first its prefill ended
                self._take(member, elapsed + member.waited)
                member.waited, made = 0.0, made + 1
            else:  # its prompt is still being prefilled, a chunk a step
                member.waited += elapsed
        self.progress.step(len(self._rows), joined + made)
        if all(m.ended for m in self._rows):  # idle now: their clients may come back at once
            self._ended, self._ended_at = len(self._rows), time.monotonic()
        self._rows = [m for m in self._rows if not m.ended]

    def _yielding(self) -> bool:
        """Whether this step only prefills: an interactive request's prompt waits while only
        Batch API rows decode, so it is run whole and alone, as on an idle server (its first
        token is not held behind their steps; they wait one step)."""
        rows = [m.row for m in self._rows]
        decoding = [m for m, row in zip(self._rows, rows, strict=True) if row and row.ready]
        return (
            bool(decoding)
            and all(m.job.background is not None for m in decoding)
            and any(
                row is not None and not row.ready and m.job.background is None
                for m, row in zip(self._rows, rows, strict=True)
            )
        )

    def _cap(self) -> int | None:
        """BACKGROUND_CHUNK while only Batch API prompts wait to be prefilled: their steps
        stay short, for an interactive request arriving waits for the step in flight."""
        waiting = [m for m in self._rows if m.row is not None and not m.row.ready]
        if waiting and all(m.job.background is not None for m in waiting):
            return BACKGROUND_CHUNK
        return None

    def _drop_cancelled(self) -> None:
        """Rows whose client left (or was cancelled) leave now, freeing their sequences, and
        halted ones (a background row preempted for an interactive request that may already
        hold its place, scheduler.py; a model switch) too."""
        for member in self._rows:
            if member.cancel.is_set():
                self._leave(member, ChoiceEnd("cancelled", member.text.count, member.text.cached))
            elif _halted(member):
                reason = halted_reason(member.job)
                self._leave(member, ChoiceEnd(reason, member.text.count, member.text.cached))
        self._rows = [m for m in self._rows if not m.ended]

    def _joined(self, member: _Member, row: BatchRow | Exception, started: float) -> None:
        if isinstance(row, Exception):  # this prompt's fault or the engine's: this row only
            log.error("joining the batch failed", exc_info=row)
            member.end(ChoiceFailed(row))
            return
        member.row = row
        member.text.cached = member.row.cached
        if member.row.budget <= 0:  # the prompt fills the window
            self._leave(member, member.text.finish("length"))
            return
        if member.row.ready:
            self._take(member, time.perf_counter() - started)
        else:  # joined while others decode: prefilled at the steps (`Batch.step`)
            member.waited = time.perf_counter() - started
        if not member.ended:
            self._rows.append(member)

    def _take(self, member: _Member, elapsed: float) -> None:
        """The row's newest token into its text; the row leaves if its choice ends."""
        row = member.row
        assert row is not None
        end = member.text.push(row.last, elapsed)
        if end is None and member.text.count >= row.budget:
            end = member.text.finish("length")
        if end is not None:
            self._leave(member, end)

    def _leave(self, member: _Member, end: ChoiceEnd | ChoiceFailed) -> None:
        if member.row is not None:
            self.batch.leave(member.row)
        member.end(end)

    def _fail(self, members: list[_Member], exc: Exception) -> None:
        for member in members:
            if not member.ended:
                try:
                    if member.row is not None:
                        self.batch.leave(member.row)
                finally:
                    member.end(ChoiceFailed(exc))
        self._rows = []


def _halted(member: _Member) -> bool:
    return member.job.halted is not None and member.job.halted.is_set()


class Choices:
    """Where a choice runs: a row of its engine's batch when its ticket is a row (one
    `Batcher` per batch, made when the first row comes), else alone."""

    def __init__(
        self,
        executor: Executor,
        publish: Callable[[str, dict[str, Any]], None],
        arrivals: Arrivals | None = None,
    ) -> None:
        self._executor = executor
        self._publish = publish
        self._arrivals = Arrivals() if arrivals is None else arrivals
        self._batchers: weakref.WeakKeyDictionary[Batch, Batcher] = weakref.WeakKeyDictionary()

    def events(
        self, engine: Engine, job: ChoiceJob, ticket: Ticket, pace: float = 0.0
    ) -> AsyncIterator[TextDelta | ChoiceEnd]:
        """One choice's text pieces, read at most every `pace` seconds (`Inbox`), then its
        end."""
        batch = engine.batch
        if not ticket.shared or batch is None:
            return choice_events(engine, job, self._executor, pace)
        batcher = self._batchers.get(batch)
        if batcher is None:
            progress = Progress(publish=self._publish)
            batcher = Batcher(engine, batch, self._executor, progress, self._arrivals)
            self._batchers[batch] = batcher
        return batcher.events(job, pace)
