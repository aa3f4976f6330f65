"""Runs one choice's generation in the engine's worker thread.

The worker samples tokens, detokenizes them incrementally and applies stop
sequences with hold-back, so a matched stop ends generation at that token.
Events reach the event loop through an `Inbox`. Closing the consumer
sets the cancel flag: the worker stops before the next forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ...engines.base import NO_HOOKS, Engine, Hooks, Prefilled, Rng, SamplingParams, Token
from ...errors import ApiError
from ..scheduler import Background
from ..stops import StopMatcher
from ..telemetry import Meter
from .detokenizer import Detokenizer
from .logprobs import TokenLogprob, prompt_entries

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of a choice's text and the reported tokens (`logprobs`) that came with it; a
    `prompt` piece is echo's: the prompt's text and its tokens, before anything generated."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt: bool = False
    generated: int = 0  # the choice's tokens generated when it went out
    cached: int = 0  # the prompt tokens its prefill found cached


@dataclass(frozen=True, slots=True)
class Captured:
    """One layer's output rows as a choice ran (`Capture`): one per position fed, with the
    ids fed there (the prompt's, then every generated token but the last)."""

    rows: Any  # [positions, width]
    token_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    finish_reason: str
    completion_tokens: int
    cached_tokens: int = 0
    captured: Captured | None = None
    stop: str | None = None  # the stop sequence that ended the choice (vLLM's `stop_reason`)
    summary: Mapping[str, Any] | None = None  # its `done` event (telemetry.py), once it ended


@dataclass(frozen=True, slots=True)
class ChoiceFailed:
    error: BaseException


ChoiceEvent = TextDelta | ChoiceEnd | ChoiceFailed


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceJob:
    """Everything one choice needs: the prompt, how to sample, where to stop."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    stop_strings: Sequence[str]
    rng: Rng | None
    halted: threading.Event | None = None  # a model switch: end at the next token, "halted"
    background: Background | None = None  # a Batch API line's mark (serving/scheduler.py)
    hooks: Hooks = NO_HOOKS  # steering, probes' monitor, a capture (a reading: serial only)
    keep_special: bool = False  # special tokens' text stays in the reply (tool-call markers)
    cancelled: threading.Event | None = None  # POST /api/cancel: end at the next token
    meter: Meter | None = None  # token and done events (GET /api/events)
    whole: bool = False  # the text goes out in one delta just before the end, not per token
    echo: str | None = None  # the prompt's text, sent first (completions' `echo`)


def run_choice(
    engine: Engine, job: ChoiceJob, cancel: threading.Event, emit: Callable[[ChoiceEvent], None]
) -> None:
    """Blocking: generate one choice, emitting deltas then exactly one end event.

    The end event goes out only after the engine left the hooks and gave the KV
    cache back, so whoever holds the slot sees a clean engine. A capture's rows
    ride on the end, with the ids fed at them.
    """
    capture = job.hooks.capture
    picked: list[int] = []  # the ids generated, for a capture's rows
    try:
        end = _generate(engine, job, cancel, emit, None if capture is None else picked.append)
    except Exception as exc:  # refused (an rng, a hook), or leaving the hooks failed
        log.exception("starting or ending the generation failed")
        end = ChoiceFailed(exc)
    if capture is not None and isinstance(end, ChoiceEnd):
        fed = [*job.prompt_ids, *picked[:-1]]  # the last token picked is never fed back
        end = replace(end, captured=Captured(capture.rows, fed))
    ended(job, end, emit)


def ended(
    job: ChoiceJob, end: ChoiceEnd | ChoiceFailed, emit: Callable[[ChoiceEvent], None]
) -> None:
    """A choice's one end event: its `done` telemetry (the summary it carries), then the
    event itself."""
    if job.meter is not None and isinstance(end, ChoiceEnd):
        end = replace(end, summary=job.meter.done(cancelled=end.finish_reason == "cancelled"))
    emit(end)


class ChoiceText:
    """One choice's text as its tokens come: detokenized, stop strings held back, counted,
    metered. The serial loop (`_generate`) and the batch (serving/completions/batching.py)
    both feed it, so a choice ends the same way on either."""

    def __init__(
        self,
        engine: Engine,
        job: ChoiceJob,
        cancel: threading.Event,
        emit: Callable[[ChoiceEvent], None],
    ) -> None:
        self._detok = Detokenizer(partial(engine.decode, keep_special=job.keep_special))
        self._stopper = StopMatcher(job.stop_strings)
        self._job = job
        self._cancel = cancel
        self._emit = emit
        self._held: list[str] = []  # a whole reply's text so far
        # A whole reply with no stop string reads no text before its end: its ids wait and
        # are detokenized then, in one warm loop, rather than each right after a forward
        # pass that swept the caches (docs/DECISIONS.md, "A whole reply's text at its end").
        self._later: list[int] | None = [] if job.whole and not self._stopper.watching else None
        # the tokens reported (`logprobs`) since a piece last went out: every one generated
        # but an end-of-generation token, whether or not a stop string cuts its text
        self._reports = job.params.logprobs is not None
        self._reported: list[TokenLogprob] = []
        self.count = 0
        self.cached = 0

    def _out(self, text: str) -> None:
        if self._job.whole:
            self._held.append(text)
        else:
            self._emit(TextDelta(text, self._taken(), False, self.count, self.cached))

    def _taken(self) -> tuple[TokenLogprob, ...]:
        reported = tuple(self._reported)
        self._reported.clear()
        return reported

    def _end(self, reason: str) -> ChoiceEnd:
        """The end event, after a whole reply's text (and the tokens reported since)."""
        self._catch_up()
        if self._held or self._reported:
            self._emit(
                TextDelta("".join(self._held), self._taken(), False, self.count, self.cached)
            )
            self._held.clear()
        stop = self._stopper.matched if reason == "stop" else None
        return ChoiceEnd(reason, self.count, self.cached, stop=stop)

    def prefilled(self, prefilled: Prefilled) -> None:
        """The prompt ran: what the cache held, and with echo the prompt's text (its tokens
        reported too when asked) as the first piece."""
        self.cached = prefilled.cached_tokens
        echo = self._job.echo
        if echo is None:
            return
        ids = self._job.prompt_ids
        tokens = prompt_entries(ids, prefilled.prompt_logprobs) if self._reports else []
        self._emit(TextDelta(echo, tuple(tokens), prompt=True))

    def push(self, token: Token, elapsed: float) -> ChoiceEnd | None:
        """Take one token (`elapsed`: seconds its step took); the end, if it ends here."""
        job = self._job
        self.count += 1
        if job.meter is not None:
            job.meter.token(elapsed)
        if token.eos:
            return self.finish("stop")
        if self._reports:
            self._reported.append(TokenLogprob(token.token_id, token.logprobs))
        if self._later is not None:
            self._later.append(token.token_id)
        elif self._take(token.token_id):
            return self._end("stop")
        if self._cancel.is_set() or (job.cancelled is not None and job.cancelled.is_set()):
            return self._end("cancelled")
        if job.halted is not None and job.halted.is_set():
            return self._end(halted_reason(job))
        return None

    def _take(self, token_id: int) -> bool:
        """Detokenize one id and send on what no stop string may still claim; whether a stop
        string matched."""
        text, matched = self._stopper.push(self._detok.push(token_id))
        if text:
            self._out(text)
        return matched

    def _catch_up(self) -> None:
        """The ids a whole reply kept for its end, detokenized (it has no stop string)."""
        later, self._later = self._later, None
        for token_id in later or ():
            self._take(token_id)

    def finish(self, reason: str) -> ChoiceEnd:
        """The end once no token is left (`reason`: "length", or "stop" after an EOS): the
        held-back text goes out, unless it completes a stop string."""
        self._catch_up()
        text, matched = self._stopper.push(self._detok.flush())
        tail = text if matched else text + self._stopper.flush()
        if tail:
            self._out(tail)
        return self._end("stop" if matched else reason)


def _generate(
    engine: Engine,
    job: ChoiceJob,
    cancel: threading.Event,
    emit: Callable[[ChoiceEvent], None],
    picked: Callable[[int], None] | None = None,
) -> ChoiceEnd | ChoiceFailed:
    """Generate one choice, emitting its deltas (`picked`: told each token id); returns the
    end event."""
    text = ChoiceText(engine, job, cancel, emit)
    tokens = engine.generate(job.prompt_ids, job.params, job.rng, job.hooks)
    try:
        stepped = time.perf_counter()
        for token in tokens:
            if isinstance(token, Prefilled):
                text.prefilled(token)
                continue
            if picked is not None:
                picked(token.token_id)
            end = text.push(token, time.perf_counter() - stepped)
            if end is not None:
                return end
            stepped = time.perf_counter()
        return text.finish("length")
    except Exception as exc:  # the engine's fault, reported to the client as an error event
        log.exception("generation failed")
        return ChoiceFailed(exc)
    finally:
        tokens.close()


class Inbox:
    """Where one choice's events cross from the engine's thread to the event loop. Closing
    its reader sets `cancel`: the choice stops before its next forward pass.

    A deque and the reader's one waiter, not an `asyncio.Queue`: a streamed token crosses
    here, and the loop's every microsecond a token is one the forward pass shares its
    cores with (docs/DECISIONS.md, the per-token chunk). For the same reason ("A stream's
    text, paced") a text piece wakes the reader only when `pace` seconds have passed since
    a piece last did (0: every piece does); the pieces that wait go out with the next one
    that wakes it, joined into one. An end always wakes the reader, so no piece waits past
    its choice's end. (A JSON reply's text comes whole, in one piece before its end:
    `ChoiceJob.whole`.)"""

    def __init__(self, pace: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = asyncio.get_running_loop()
        self._events: deque[ChoiceEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._pace = pace
        self._clock = clock
        self._woken = -math.inf  # when a text piece last woke the reader
        self.cancel = threading.Event()

    def emit(self, event: ChoiceEvent) -> None:
        """From the engine's thread."""
        self._events.append(event)
        if self._due(event):
            self._loop.call_soon_threadsafe(self._wake)

    def hold(self, event: ChoiceEvent) -> bool:
        """From the engine's thread: keep `event` here without waking the reader when it
        would not wake it (a text piece within `pace` of the last that did), True; else
        False, and the caller `put`s it on the loop's thread."""
        if isinstance(event, TextDelta) and self._clock() - self._woken < self._pace:
            self._events.append(event)
            return True
        return False

    def put(self, event: ChoiceEvent) -> None:
        """From the event loop's own thread."""
        self._events.append(event)
        if self._due(event):
            self._wake()

    def _due(self, event: ChoiceEvent) -> bool:
        """Whether `event` wakes the reader; a text piece that does not waits in the deque
        for the next one that does, or for the end."""
        if not isinstance(event, TextDelta):
            return True
        now = self._clock()
        if now - self._woken < self._pace:
            return False
        self._woken = now
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def read(self) -> AsyncGenerator[ChoiceEvent, None]:
        """The events until the end (or failure) event. A reader dropped before it started
        (its consumer closed first) stops the choice too: its finally would never run."""
        reader = self._read()
        weakref.finalize(reader, self.cancel.set)
        return reader

    async def _read(self) -> AsyncGenerator[ChoiceEvent, None]:
        events = self._events
        try:
            while True:
                while not events:
                    self._waiter = self._loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                event = events.popleft()
                if isinstance(event, TextDelta) and _joins(event) and events and _joins(events[0]):
                    event = _joined(event, events)
                yield event
                if not isinstance(event, TextDelta):
                    return
        finally:
            self.cancel.set()


def _joins(event: ChoiceEvent) -> bool:
    """Whether `event` is a generated text piece (joined with those waiting beside it)."""
    return isinstance(event, TextDelta) and not event.prompt


def _joined(first: TextDelta, events: deque[ChoiceEvent]) -> TextDelta:
    """`first` and the text pieces that wait after it, taken out of `events`, as one."""
    parts, reported, last = [first.text], list(first.logprobs), first
    while events and _joins(waiting := events[0]):
        assert isinstance(waiting, TextDelta)
        events.popleft()
        parts.append(waiting.text)
        reported.extend(waiting.logprobs)
        last = waiting
    return TextDelta("".join(parts), tuple(reported), False, last.generated, last.cached)


def stream_choice(
    engine: Engine, job: ChoiceJob, executor: Executor, pace: float = 0.0
) -> AsyncGenerator[ChoiceEvent, None]:
    """The events of one choice, generated alone in the engine's thread (`pace`: as
    `Inbox` takes it)."""
    inbox = Inbox(pace)
    loop = asyncio.get_running_loop()
    loop.run_in_executor(executor, run_choice, engine, job, inbox.cancel, inbox.emit)
    return inbox.read()


def choice_events(
    engine: Engine, job: ChoiceJob, executor: Executor, pace: float = 0.0
) -> AsyncIterator[TextDelta | ChoiceEnd]:
    """One choice as the JSON and the SSE paths both read it: its text pieces, then its end
    (`pace`: as `Inbox` takes it)."""
    return delivered(stream_choice(engine, job, executor, pace))


async def delivered(
    events: AsyncGenerator[ChoiceEvent, None],
) -> AsyncIterator[TextDelta | ChoiceEnd]:
    """A choice's events as its readers take them, whether it ran alone or in the batch.

    A failure in the engine is raised here; a generation halted for a model switch
    ends the request with 503 model_busy. Closing this closes `events` at once, which
    stops the choice.
    """
    try:
        async for event in events:
            if isinstance(event, ChoiceFailed):
                raise event.error
            if isinstance(event, ChoiceEnd):
                yield unless_halted(event)
                return
            yield event
        raise RuntimeError("generation ended without an end event")
    finally:
        await events.aclose()


@dataclass(slots=True)
class Collected:
    """A choice read whole (a JSON reply's): its text, and with echo the prompt's text first;
    the tokens reported of each."""

    text: str = ""
    echo: str | None = None
    prompt: list[TokenLogprob] = field(default_factory=list)
    tokens: list[TokenLogprob] = field(default_factory=list)


async def collect(events: AsyncIterator[TextDelta | ChoiceEnd]) -> tuple[Collected, ChoiceEnd]:
    """A choice's whole text and its end (a JSON reply's)."""
    whole = Collected()
    parts: list[str] = []
    async for event in events:
        if isinstance(event, ChoiceEnd):
            whole.text = "".join(parts)
            return whole, event
        if event.prompt:
            whole.echo = event.text
            whole.prompt.extend(event.logprobs)
        else:
            parts.append(event.text)
            whole.tokens.extend(event.logprobs)
    raise RuntimeError("generation ended without an end event")


def halted_reason(job: ChoiceJob) -> str:
    """Why a halted choice ended: `preempted` (a Batch API line's row, taken back for an
    interactive request, serving/scheduler.py), else `halted` (a model switch)."""
    return "preempted" if job.background is not None and job.background.preempted else "halted"


def unless_halted(end: ChoiceEnd) -> ChoiceEnd:
    """A generation halted for a model switch ends the request with 503 model_busy; a
    preempted Batch API line with 503 preempted, which its runner asks again."""
    if end.finish_reason == "preempted":
        raise ApiError(
            "preempted", "This batch line gave its row to an interactive request; it runs again."
        )
    if end.finish_reason == "halted":
        raise ApiError(
            "model_busy",
            "The model was unloaded while this request generated "
            "(GRACEFUL_UNLOAD_TIMEOUT passed); retry.",
            "model",
        )
    return end
