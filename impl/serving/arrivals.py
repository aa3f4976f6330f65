"""Generation requests on their way to a batch, so an idle batch admits those that came together.

Requests that arrive together (clients whose replies ended in the same step
send their next at once) reach the batch a few milliseconds apart: each is
parsed, checked, rendered and tokenized on the event loop in turn. An idle
batch that admitted the first alone would prefill it, then hold it while the
others' prompts are prefilled at its next step; the rows would stay out of
step for good, each stalled by the others' prefills. So a POST that may
generate is counted from the moment it reaches the server (`arriving`) until
its first choice joins a batch (`joined`) or it ends otherwise, and an idle
batch waits for the ones counted, and for as many as the rows that ended
together in its last step (their clients' next requests), GATHER_S at most
(`gathered`; `batching.Batcher`): rows that arrive together are prefilled
together, as `llama-server` prefills the slots its loop finds waiting. A lone
request waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

GATHER_S = 0.05  # the longest an idle batch waits for requests on their way


@dataclass(eq=False, slots=True)
class _Arrival:
    """One request on its way: counted until it joins or ends, once."""

    arrivals: Arrivals
    done: bool = False

    def settle(self) -> None:
        if not self.done:
            self.done = True
            self.arrivals.settled()


_current: ContextVar[_Arrival | None] = ContextVar("arrival", default=None)


@dataclass(eq=False, slots=True)
class Arrivals:
    """How many generation requests are on their way to a batch."""

    coming: int = 0
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)  # `gathered`'s

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Count the request this block serves until it joins a batch or the block ends."""
        arrival = _Arrival(self)
        self.coming += 1
        reset = _current.set(arrival)
        try:
            yield
        finally:
            arrival.settle()
            _current.reset(reset)

    def joined(self) -> None:
        """The current request's choice joined a batch: it is no longer on its way."""
        arrival = _current.get()
        if arrival is not None:
            arrival.settle()

    def settled(self) -> None:
        self.coming -= 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def gathered(self, enough: Callable[[], bool], within: float = GATHER_S) -> None:
        """Wait until `enough()` (asked again whenever one on its way joins or ends), at
        most `within` seconds. Two turns of the event loop first, so that requests whose
        bytes are in already are counted."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + within
        for _ in range(2):
            await asyncio.sleep(0)
        while not enough():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return
            finally:
                self._waiters.remove(waiter)
