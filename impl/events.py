"""Live events for `GET /api/events` (LOC-EVENTS): one bus, a bounded queue per listener.

`publish()` may be called from the event loop or from the engine's worker
thread (token telemetry); it never blocks. A listener that falls behind
loses its oldest events rather than slowing generation. Telemetry that
costs something to measure is only gathered while someone listens
(`listening`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .request_context import NONE, RequestIdFilter


@dataclass(frozen=True, slots=True)
class Event:
    name: str  # state | token | done | decide | config | log
    data: dict[str, Any]


class EventBus:
    def __init__(self, max_queue: int = 1024) -> None:
        self._max = max_queue
        self._queues: list[asyncio.Queue[Event]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._taps: dict[str, list[Callable[[dict[str, Any]], None]]] = {}

    def tap(self, name: str, observer: Callable[[dict[str, Any]], None]) -> None:
        """Call `observer` with every `name` event's data, listeners or not, in the
        publisher's thread (the planner reads `done` this way: LOC-PLAN-47)."""
        self._taps.setdefault(name, []).append(observer)

    @property
    def listening(self) -> bool:
        return bool(self._queues)

    def publish(self, name: str, data: dict[str, Any]) -> None:
        """Send an event to every listener; safe from any thread."""
        for observer in self._taps.get(name, ()):
            observer(data)
        loop = self._loop
        if loop is None or not self._queues:
            return
        event = Event(name, data)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._deliver(event)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: Event) -> None:
        with self._lock:
            queues = list(self._queues)
        for queue in queues:
            if queue.full():
                queue.get_nowait()  # the oldest goes: a slow listener never slows the server
            queue.put_nowait(event)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event]]:
        """A queue of the events published from now on, while the block runs."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue(self._max)
        with self._lock:
            self._queues.append(queue)
        try:
            yield queue
        finally:
            with self._lock:
                self._queues.remove(queue)


_LEVELS = {logging.DEBUG: "info", logging.INFO: "info", logging.WARNING: "warn"}


class LogEvents(logging.Handler):
    """The server's own log records (info and up) as `log` events (LOC-EVENTS-26), each
    with the `request_id` it was logged for (null outside a request)."""

    def __init__(self, bus: EventBus) -> None:
        super().__init__(logging.INFO)
        self._bus = bus
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        if not self._bus.listening:
            return
        level = _LEVELS.get(record.levelno, "error")
        rid = getattr(record, "request_id", NONE)
        self._bus.publish(
            "log",
            {
                "level": level,
                "message": record.getMessage(),
                "request_id": None if rid == NONE else rid,
            },
        )
