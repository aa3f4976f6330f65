"""One completion request's armed probes: fitted, read per choice, recorded once.

A `ProbeRun` exists only while some probe is armed as the request comes in
(`probe_run` gives None otherwise, and the response is then what it would be
without probes, byte for byte: OAI-PROBE-06). It is fitted to the engine that
serves the request (again after a reload), gives each choice a fresh
monitor, reads each choice's results as it ends, and records them once the
response went out whole; a response that never did records every started
choice's results as `interrupted`, and sends none (OAI-PROBE-09).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ...engines.base import Engine
from ...engines.monitor import Monitor
from ...probes.admin import ProbeAdmin
from ...probes.trace import fresh
from ...probes.verdicts import order
from ...probes.watch import Served, Watch, Windows, shape
from ...steering.live import LiveSteering
from ..scheduler import Ticket
from .generation import ChoiceEnd
from .prepared import Prepared

log = logging.getLogger(__name__)

INTERRUPTED_FED = 2**62  # an ended-early choice's window reads every value its monitor got


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """A choice whose generation started: what its probe results need."""

    monitor: Monitor | None
    index: int  # the choice's index in the response
    prompt: int  # its prompt's index
    shared: bool  # decoded as a row of the batch


def probe_run(
    probes: ProbeAdmin | None, trace_id: str | None, live: LiveSteering, model_id: str
) -> ProbeRun | None:
    """The run of the probes armed now; None while none is."""
    armed = () if probes is None else probes.armed()
    if not armed or probes is None:
        return None
    return ProbeRun(Watch(armed, trace_id or fresh()), probes, live, model_id)


class ProbeRun:
    def __init__(self, watch: Watch, probes: ProbeAdmin, live: LiveSteering, model: str) -> None:
        self._watch = watch
        self._probes = probes
        self._live = live
        self._model = model
        self._started: list[Started] = []
        self._results: list[dict[str, Any]] = []

    def fit(self, engine: Engine) -> bool:
        """Fit the probes to `engine`; whether a running one reads `last_user` windows."""
        self._watch.fit(shape(engine, self._model, self._live))
        return self._watch.needs_user

    def monitor(self) -> Monitor | None:
        """A fresh monitor for one choice (None when no probe runs on this model)."""
        return self._watch.monitor()

    def started(self, monitor: Monitor | None, *, index: int, prompt: int, ticket: Ticket) -> None:
        self._started.append(
            Started(monitor=monitor, index=index, prompt=prompt, shared=ticket.shared)
        )

    def ended(self, prepared: Prepared, end: ChoiceEnd, request_id: str) -> None:
        """The results of the choice that started last, which ended with `end`."""
        run = self._started[-1]
        self._results.extend(self._of(prepared, run, request_id, end, None))

    def results(self) -> list[dict[str, Any]]:
        """Every ended choice's results, in the response's order."""
        return sorted(self._results, key=order)

    async def record(self) -> list[dict[str, Any]]:
        """Record the results of a response that went out whole; the results."""
        results = self.results()
        if results:
            await asyncio.to_thread(self._probes.record, results)
        return results

    def interrupted(self, prepared: Prepared | None, request_id: str, reason: str) -> None:
        """A response that never went out whole: every started choice's results, recorded
        as `interrupted` (`reason`) and never sent."""
        if prepared is None or not self._started:
            return
        results = []
        for run in self._started:
            results.extend(self._of(prepared, run, request_id, None, reason))
        try:
            self._probes.record(sorted(results, key=order))
        except Exception:  # the response has failed already; its results are logged instead
            log.exception("recording %d interrupted probe results failed", len(results))

    def _of(
        self,
        prepared: Prepared,
        run: Started,
        request_id: str,
        end: ChoiceEnd | None,
        interrupted: str | None,
    ) -> list[dict[str, Any]]:
        """One choice's probe results; `end` None: it ended early, `interrupted` says why."""
        fed = INTERRUPTED_FED if end is None else max(0, end.completion_tokens - 1)
        user = prepared.user_spans[run.prompt] if prepared.user_spans else None
        windows = Windows(prompt=len(prepared.prompt_ids[run.prompt]), fed=fed, user=user)
        served = Served(
            backend="batch" if run.shared else "serial",
            engine=prepared.engine.facts.engine,
            model=self._model,
        )
        return self._watch.results(
            run.monitor,
            windows,
            index=run.index,
            served=served,
            request_id=request_id,
            interrupted=interrupted,
        )
