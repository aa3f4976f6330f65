"""Every replica's events on the ingress's `/api/events` (issue 49 item 3).

An engine replica's server publishes its events (`token`, `done`, `state`,
`decide`, `config`, `download`, `batch_job`, `log`, ...) on its own bus. While
an ingress has a listener, each replica subscribes to its bus and sends what it
publishes to the control in small batches (`Events.publish`); the control keeps
the last `KEPT` in order, and each ingress listener long-polls them from there
(`Events.after`). With no listener anywhere a replica does not subscribe, so
its server publishes no per-token events (they are published only to
listeners).

On the ingress, `GET /api/events` answers `state` on connect (an engine
replica's `GET /api/info`), then every replica's events as they come, and
`: ping` when quiet, as a single server's does (LOC-EVENTS-02/03).
Probe results need no relay: they are rows of the shared database, and
`/api/probes/events` reads them on any replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..handlers.session import PING_SECONDS
from ..http.sse import named

KEPT = 4096  # events the control keeps for listeners that fell behind
LISTENER_GONE_S = 30.0  # a listener that has not polled this long is gone
WAIT_S = 25.0  # a long poll's longest wait
BATCH_S = 0.05  # a replica gathers its events this long before sending them

Published = tuple[str, dict[str, Any]]  # an event's name and data


class Events:
    """The control's side: the events every replica sent, in order, for the listeners."""

    def __init__(self) -> None:
        self._kept: deque[tuple[int, Published]] = deque(maxlen=KEPT)
        self._seq = itertools.count(1)
        self._last = 0
        self._listeners: dict[str, float] = {}  # listener -> when it last polled
        self._changed = asyncio.Condition()

    def listening(self) -> bool:
        now = time.monotonic()
        return any(now - seen < LISTENER_GONE_S for seen in self._listeners.values())

    async def publish(self, events: list[Published]) -> bool:
        """Keep `events`; whether any ingress still listens."""
        if events:
            for event in events:
                self._last = next(self._seq)
                self._kept.append((self._last, event))
            async with self._changed:
                self._changed.notify_all()
        return self.listening()

    async def wait_listening(self) -> bool:
        """Whether an ingress listens, once one does (or after WAIT_S)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(self.listening), WAIT_S)
        return self.listening()

    async def after(
        self, listener: str, seq: int | None, wait_s: float = WAIT_S
    ) -> tuple[int, list[Published]]:
        """The events after `seq` (None: from now on), once there are any (or after
        `wait_s`), and the sequence number to ask after next."""
        first = listener not in self._listeners
        self._listeners[listener] = time.monotonic()
        if first:
            async with self._changed:
                self._changed.notify_all()  # the replicas start sending
        if seq is None:
            return self._last, []
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(lambda: self._last > seq), wait_s)
        self._listeners[listener] = time.monotonic()
        return self._last, [event for n, event in self._kept if n > seq]

    def leave(self, listener: str) -> None:
        self._listeners.pop(listener, None)


async def sending(bus: Any, control: Any) -> None:
    """A replica's side: its bus's events to the control while an ingress listens."""
    while True:
        if not await control.wait_listening.remote():
            continue
        async with bus.subscribe() as queue:
            listening = True
            while listening:
                batch = [await _next(queue)]
                await asyncio.sleep(BATCH_S)
                while not queue.empty():
                    batch.append(queue.get_nowait())
                sent = [(e.name, e.data) for e in batch if e is not None]
                listening = await control.publish.remote(sent)


async def _next(queue: asyncio.Queue[Any]) -> Any:
    """The next event, or None after a while (so that `publish` says whether anyone
    still listens)."""
    try:
        return await asyncio.wait_for(queue.get(), LISTENER_GONE_S / 3)
    except TimeoutError:
        return None


def listened(control: Any, info: Callable[[], Awaitable[dict[str, Any]]]) -> ASGIApp:
    """The ingress's `GET /api/events`: an ASGI app over the control's relay; `info()`
    gives the `state` event's data (an engine replica's `GET /api/info`)."""

    async def events(scope: Scope, receive: Receive, send: Send) -> None:
        listener = f"{id(scope)}-{time.monotonic()}"

        async def stream() -> AsyncIterator[bytes]:
            try:
                seq, _ = await control.events_after.remote(listener, None)
                yield named("state", await info())
                while True:
                    seq, found = await control.events_after.remote(listener, seq, PING_SECONDS)
                    for name, data in found:
                        yield named(name, data)
                    if not found:
                        yield b": ping\n\n"
            finally:
                control.leave_events.remote(listener)

        response = StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        await response(scope, receive, send)

    return events
