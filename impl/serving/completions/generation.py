"""Runs one choice's generation in the engine's worker thread.

The worker samples tokens, detokenizes them incrementally and applies stop
sequences with hold-back, so a matched stop ends generation at that token.
Events reach the event loop through an asyncio queue. Closing the consumer
sets the cancel flag: the worker stops before the next forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial

from ...engines.base import Engine, Prefilled, Rng, SamplingParams, SteeringSource
from ...errors import ApiError
from ..stops import StopMatcher
from ..telemetry import Meter
from .detokenizer import Detokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    finish_reason: str
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ChoiceFailed:
    error: BaseException


Event = TextDelta | ChoiceEnd | ChoiceFailed


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceJob:
    """Everything one choice needs: the prompt, how to sample, where to stop."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    stop_strings: Sequence[str]
    rng: Rng | None
    halted: threading.Event | None = None  # a model switch: end at the next token, "halted"
    steering: SteeringSource | None = None
    keep_special: bool = False  # special tokens' text stays in the reply (tool-call markers)
    cancelled: threading.Event | None = None  # POST /api/cancel: end at the next token
    meter: Meter | None = None  # token and done events (GET /api/events)


def _steered(engine: Engine, job: ChoiceJob) -> AbstractContextManager[None]:
    return nullcontext() if job.steering is None else engine.steered(job.steering)


def run_choice(
    engine: Engine, job: ChoiceJob, cancel: threading.Event, emit: Callable[[Event], None]
) -> None:
    """Blocking: generate one choice, emitting deltas then exactly one end event.

    The end event goes out only after the steering hooks are removed and the
    KV cache is given back, so whoever holds the slot sees a clean engine.
    """
    end: ChoiceEnd | ChoiceFailed
    try:
        with _steered(engine, job):
            end = _generate(engine, job, cancel, emit)
    except Exception as exc:  # entering or leaving the hooks failed: the engine's fault
        log.exception("steering hooks failed")
        end = ChoiceFailed(exc)
    if job.meter is not None and isinstance(end, ChoiceEnd):
        job.meter.done(cancelled=end.finish_reason == "cancelled")
    emit(end)


def _generate(
    engine: Engine, job: ChoiceJob, cancel: threading.Event, emit: Callable[[Event], None]
) -> ChoiceEnd | ChoiceFailed:
    """Generate one choice, emitting its deltas; returns the end event."""
    detok = Detokenizer(partial(engine.decode, keep_special=job.keep_special))
    stopper = StopMatcher(job.stop_strings)
    count, cached, reason = 0, 0, "length"
    tokens = engine.generate(job.prompt_ids, job.params, job.rng)
    try:
        stepped = time.perf_counter()
        for token in tokens:
            if isinstance(token, Prefilled):
                cached = token.cached_tokens
                continue
            count += 1
            if job.meter is not None:
                job.meter.token(time.perf_counter() - stepped)
            if token.eos:
                reason = "stop"
                break
            text, matched = stopper.push(detok.push(token.token_id))
            if text:
                emit(TextDelta(text))
            if matched:
                return ChoiceEnd("stop", count, cached)
            if cancel.is_set() or (job.cancelled is not None and job.cancelled.is_set()):
                return ChoiceEnd("cancelled", count, cached)
            if job.halted is not None and job.halted.is_set():
                return ChoiceEnd("halted", count, cached)
            stepped = time.perf_counter()
        text, matched = stopper.push(detok.flush())
        tail = text if matched else text + stopper.flush()
        if tail:
            emit(TextDelta(tail))
        return ChoiceEnd("stop" if matched else reason, count, cached)
    except Exception as exc:  # the engine's fault, reported to the client as an error event
        log.exception("generation failed")
        return ChoiceFailed(exc)
    finally:
        tokens.close()


async def stream_choice(
    engine: Engine, job: ChoiceJob, executor: Executor, on_done: Callable[[], None] | None = None
) -> AsyncIterator[Event]:
    """The events of one choice; `on_done` runs once the worker has really stopped."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()
    cancel = threading.Event()

    def emit(event: Event) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    future = loop.run_in_executor(executor, run_choice, engine, job, cancel, emit)
    if on_done is not None:
        future.add_done_callback(lambda _: on_done())
    try:
        while True:
            event = await queue.get()
            yield event
            if not isinstance(event, TextDelta):
                return
    finally:
        cancel.set()


async def choice_events(
    engine: Engine, job: ChoiceJob, executor: Executor
) -> AsyncIterator[TextDelta | ChoiceEnd]:
    """One choice as the JSON and the SSE paths both read it: its text pieces, then its end.

    A failure in the engine is raised here; a generation halted for a model switch
    ends the request with 503 model_busy.
    """
    async for event in stream_choice(engine, job, executor):
        if isinstance(event, ChoiceFailed):
            raise event.error
        if isinstance(event, ChoiceEnd):
            yield unless_halted(event)
            return
        yield event
    raise RuntimeError("generation ended without an end event")


def unless_halted(end: ChoiceEnd) -> ChoiceEnd:
    """A generation halted for a model switch ends the request with 503 model_busy."""
    if end.finish_reason == "halted":
        raise ApiError(
            "model_busy",
            "The model was unloaded while this request generated "
            "(GRACEFUL_UNLOAD_TIMEOUT passed); retry.",
            "model",
        )
    return end
