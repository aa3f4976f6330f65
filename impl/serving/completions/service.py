"""Chat and text completions: refusals, slot, prepared prompt, generation, response.

Order matters and is the contract's: the field policy and every refusal
that needs no model run before any load; the context-length check runs
before a stream starts; the slot is held while the engine generates. A
request takes these forms on its way (docs/ARCHITECTURE.md): `Accepted`
(accepted.py), `Prepared` per engine (prepared.py), a `ChoiceJob` with its
`Hooks` per choice (generation.py). Scoring has its own path
(scoring_service.py); the probes' bookkeeping is probe_run.py, the
steering's steered.py, the activations' activations.py.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from ... import headers as hdr
from ...engines.base import Capability, Engine, Rng
from ...events import EventBus
from ...metrics import Metrics
from ...models.manager import ModelManager
from ...probes.admin import ProbeAdmin
from ...probes.verdicts import serialize as serialize_verdicts
from ...settings import Settings
from ...steering.live import LiveSteering
from ...steering.source import RequestSource
from ...tracing import RequestTrace, Tracing
from ..admission import Admission
from ..arrivals import Arrivals
from ..chat.tools import format_header
from ..renames import renamed
from ..results import Comment, Encoded, Reply, StreamReply
from ..scheduler import Lease, Scheduler, Ticket, claim, holding
from ..telemetry import Meter
from . import shapes, steered
from .accepted import Accepted
from .batching import Choices
from .defaults import RequestDefaults
from .generation import ChoiceEnd, ChoiceJob, collect
from .prepared import Prepared, Tally, as_rendered, job, prepare
from .probe_run import probe_run
from .reading import reading_of
from .refusals import echoes, refusals
from .requests import GenerationRequest
from .scoring_service import ScoringService
from .streamed import Finished, choice_chunks

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}  # span names


class CompletionService:
    def __init__(
        self,
        settings: Settings,
        manager: ModelManager,
        scheduler: Scheduler,
        executor: Executor,
        *,
        live: LiveSteering,
        generating: Callable[[], AbstractContextManager[None]],
        bus: EventBus,
        defaults: Callable[[], RequestDefaults] = RequestDefaults,
        probes: ProbeAdmin | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._metrics = metrics  # GET /metrics (none in tests that build the service alone)
        self._tracing = tracing  # OTLP spans (tracing.py); None or off: none made
        self._probes = probes  # the armed probes, and where their results are recorded
        self._defaults = defaults  # the config's, read per request
        self._generating = generating  # counts a generation in /api/info while it runs
        self._bus = bus
        self._settings = settings
        self._live = live
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor
        self._scoring = ScoringService(settings, manager, scheduler, executor)
        self.arrivals = Arrivals()  # requests on their way to a batch (the server counts them)
        self._choices = Choices(executor, bus.publish, self.arrivals)

    def defaults(self) -> RequestDefaults:
        """The config's defaults for what a request leaves out, read now."""
        return self._defaults()

    async def serve(self, req: GenerationRequest, admission: Admission) -> Reply | StreamReply:
        """Answer one chat or text completion request: refusals first (none needs the model),
        then the config's defaults, then the scoring, JSON or streamed path."""
        arrived = None if self._metrics is None else self._metrics.request(admission.entry.model_id)
        defaults = self._defaults()  # the config read once: a queued request keeps what it saw
        unused, thinking = refusals(req, admission, defaults)
        reported = [renamed(u, req.names) for u in unused]  # a front end's names
        headers = admission.headers(reported, self._settings.ignored_fields_header_max_bytes)
        attached = self._live.attachments(admission.entry.model_id) if req.activations else []
        reading = reading_of(req, attached, max_top_k=self._settings.sae_activations_max_top_k)
        if req.scoring is not None:
            headers.update(echoes(req))
            self._manager.refuse_if_busy()
            accepted = Accepted(
                request=req, entry=admission.entry, defaults=defaults, reading=reading
            )
            return await self._scoring.score(accepted, headers, req.scoring)
        resolution = steered.resolution(
            req.steering, self._live, self._manager, admission.entry, admission.capabilities
        )
        if req.steering.intensity is not None and resolution.echo is not None:
            headers[hdr.STEERING_INTENSITY] = repr(float(resolution.echo))
        self._manager.refuse_if_busy()
        req = defaults.apply(req, seeds=Capability.SEED in admission.capabilities)
        headers.update(echoes(req))  # the seed (the config's too), the constraint
        accepted = Accepted(  # an unused field does nothing
            request=as_rendered(req, [*admission.ignored, *unused], thinking),
            entry=admission.entry,
            defaults=defaults,
            reading=reading,
            probes=probe_run(
                self._probes, admission.trace_id, self._live, admission.entry.model_id
            ),
            watch=arrived,
            trace=self._trace(req, admission),
        )
        return await (
            self._stream(accepted, headers) if req.stream else self._reply(accepted, headers)
        )

    def _trace(self, req: GenerationRequest, admission: Admission) -> RequestTrace | None:
        """The request's spans while tracing is on (tracing.py), named by its route."""
        if self._tracing is None:
            return None
        route = ROUTES.get(req.endpoint, f"/v1/{req.endpoint}")
        return self._tracing.request(f"POST {route}", admission.traceparent, req.stream)

    async def _ready(
        self, accepted: Accepted, engine: Engine, prepared: Prepared | None = None
    ) -> Prepared:
        """The request prepared for `engine`: `prepared` when made for it, else made now (a
        reload while the request waited): the probes fitted, the reading's size checked."""
        if prepared is not None and prepared.engine is engine:
            return prepared
        needs_user = accepted.probes is not None and accepted.probes.fit(engine)
        req = accepted.request
        prepared = await prepare(
            req, engine, self._manager, accepted.defaults, user_spans=needs_user
        )
        if accepted.reading is not None:
            limit = self._settings.sae_activations_max_entries
            accepted.reading.check(prepared, max_entries=limit)
        return prepared

    def _job(
        self,
        accepted: Accepted,
        prepared: Prepared,
        i: int,
        index: int,
        rng: Rng | None,
        source: RequestSource | None,
        ticket: Ticket,
    ) -> ChoiceJob:
        """Prompt i's next choice (the response's `index`), started for its probes; `rng` is
        the prompt's, shared by its `n` choices (a seed's choices differ, OAI-SEED-04)."""
        meter = Meter(  # the per-token readings only while someone listens to /api/events
            emit=self._bus.publish,
            steps=prepared.budgets[i],
            n_prompt=len(prepared.prompt_ids[i]),
            load_s=self._manager.load_seconds,
            quiet=not self._bus.listening,
            watch=accepted.watch,
        )
        if accepted.watch is not None:
            accepted.watch.started(len(prepared.prompt_ids[i]))
        work = job(prepared, i, rng, ticket, hooks=accepted.hooks(source), meter=meter)
        if accepted.probes is not None:
            accepted.probes.started(work.hooks.monitor, index=index, prompt=i, ticket=ticket)
        return work

    # -- non-streamed ------------------------------------------------------------

    async def _reply(self, accepted: Accepted, headers: dict[str, str]) -> Reply:
        resident = self._manager.engine_if_resident(accepted.entry)
        # prepared first where it can be: whether it runs as a row needs its sizes
        prepared = None if resident is None else await self._ready(accepted, resident)
        env = shapes.Envelope.new(accepted.request.endpoint, accepted.entry.model_id)
        shared = accepted.as_row(prepared, self._manager.engine_if_resident(accepted.entry))
        timeout = self._settings.graceful_unload_timeout
        async with holding(
            self._manager, self._scheduler, accepted.entry, timeout, shared=shared
        ) as slot:
            if accepted.watch is not None:
                accepted.watch.scheduled()
            prepared = await self._ready(accepted, slot.engine, prepared)
            source = accepted.steering(self._live, slot.engine)
            try:
                with self._generating():
                    choices, tally, last = await self._generate_all(
                        accepted, prepared, source, slot.ticket, env.id
                    )
            except BaseException as exc:  # the client left, or the generation failed
                accepted.interrupted(prepared, env.id, exc)
                raise
        statement, rung = steered.header(source), steered.rung(source)
        accepted.finished(prepared, tally, statement, rung)
        body = env.body(choices, tally.usage(prepared), shapes.fingerprint(prepared.engine.facts))
        body |= accepted.report(prepared, tally, last)
        if accepted.reading is not None and last is not None:  # only when asked (OAI-ACT-15)
            body["millm"] = accepted.reading.millm(last.captured, prepared)
        headers = {**headers, **format_header(prepared.tools), hdr.STEERING: statement}
        if rung is not None:  # only when a circuit steered (OAI-RUNG-01, RUNG-09..17)
            headers[hdr.CIRCUIT_RUNG] = rung
        if accepted.probes is not None:  # only while a probe is armed (OAI-PROBE-06)
            verdicts = await accepted.probes.record()
            body["millm_probe_verdicts"] = verdicts
            headers[hdr.PROBE_VERDICTS] = serialize_verdicts(verdicts, choices=len(choices))
        return Reply(body, headers)

    async def _generate_all(
        self,
        accepted: Accepted,
        prepared: Prepared,
        source: RequestSource | None,
        ticket: Ticket,
        request_id: str,
    ) -> tuple[list[dict[str, Any]], Tally, ChoiceEnd | None]:
        """Every choice, the counts and the last choice's end (a reading's rows ride on it)."""
        r = accepted.request
        choices: list[dict[str, Any]] = []
        tally = Tally()
        end: ChoiceEnd | None = None
        for i in range(len(r.prompts)):
            rng = prepared.engine.new_rng(r.seed)
            for k in range(r.n):
                work = self._job(accepted, prepared, i, len(choices), rng, source, ticket)
                whole, end = await collect(self._choices.events(prepared.engine, work, ticket))
                choices.append(prepared.choice(len(choices), whole, end.finish_reason, end.stop))
                tally.add(end, first_of_prompt=k == 0)
                accepted.ended(prepared, i, end)
                if accepted.probes is not None:
                    accepted.probes.ended(prepared, end, request_id)
        return choices, tally, end

    # -- streamed ----------------------------------------------------------------

    async def _stream(self, accepted: Accepted, headers: dict[str, str]) -> StreamReply:
        """Every refusal happens here, before the stream (and its 200) starts.

        A model that must be loaded first is loaded, holding the slot, before the
        200: a failed load is a status, not an event. A resident model's request
        takes its place in line here and waits inside the stream, which sends
        `: waiting for a turn` comments meanwhile. Either way the `Lease` gives the
        place back once, however the stream ends (scheduler.py).
        """
        engine = self._manager.engine_if_resident(accepted.entry)
        if engine is None:
            switch_timeout = self._settings.graceful_unload_timeout
            slot = await claim(self._manager, self._scheduler, accepted.entry, switch_timeout)
            lease = Lease(self._scheduler, slot.ticket)
            with lease.released_on_error():
                prepared = await self._ready(accepted, slot.engine)
        else:
            prepared = await self._ready(accepted, engine)
            shared = accepted.as_row(prepared, self._manager.engine_if_resident(accepted.entry))
            lease = Lease(self._scheduler, self._scheduler.enter(shared=shared))
        events = self._events(accepted, prepared, lease)
        lease.bind(events)  # a stream whose body never starts (client gone first) lets go too
        return StreamReply(events, {**headers, **format_header(prepared.tools)})

    async def _events(
        self, accepted: Accepted, prepared: Prepared, lease: Lease
    ) -> AsyncGenerator[dict[str, Any] | Encoded | Comment, None]:
        try:
            while not await lease.wait(self._settings.queue_heartbeat):
                yield Comment("waiting for a turn")
            switch_timeout = self._settings.graceful_unload_timeout
            slot = await lease.slot(self._manager, accepted.entry, switch_timeout)
            if accepted.watch is not None:
                accepted.watch.scheduled()
            prepared = await self._ready(accepted, slot.engine, prepared)  # reloaded meanwhile?
            source = accepted.steering(self._live, slot.engine)
            env = shapes.Envelope.new(accepted.request.endpoint, accepted.entry.model_id)
            request = accepted.request
            fingerprint = shapes.fingerprint(slot.engine.facts)
            out = env.chunks(fingerprint, request.include_usage, request.continuous_usage)
            async for chunk in self._streamed(accepted, prepared, source, out, slot.ticket):
                yield chunk
        finally:
            lease.release()

    async def _streamed(
        self,
        accepted: Accepted,
        prepared: Prepared,
        source: RequestSource | None,
        out: shapes.Chunks,
        ticket: Ticket,
    ) -> AsyncIterator[dict[str, Any] | Encoded]:
        """The stream's chunks once the slot is held: the choices, then the probe verdicts,
        the activations and the steering chunk (OAI-PROBE-08, open point 19). A stream that
        ends early records its probe results as `interrupted` (OAI-PROBE-09)."""
        tally = Tally()
        last = len(accepted.request.prompts) - 1
        millm = None
        request_id = out.envelope.id
        try:
            with self._generating():
                for i in range(last + 1):
                    rng = prepared.engine.new_rng(accepted.request.seed)
                    work = self._job(accepted, prepared, i, i, rng, source, ticket)
                    pace = self._settings.stream_interval
                    events = self._choices.events(prepared.engine, work, ticket, pace)
                    so_far = partial(tally.so_far, prepared) if out.continuous else None
                    async for item in choice_chunks(prepared, out, i, events, so_far):
                        if not isinstance(item, Finished):
                            yield item
                            continue
                        tally.add(item.end, first_of_prompt=True)
                        accepted.ended(prepared, i, item.end)
                        if accepted.reading is not None:
                            millm = accepted.reading.millm(item.end.captured, prepared)
                        if accepted.probes is not None:
                            accepted.probes.ended(prepared, item.end, request_id)
                        # one usage per stream: the whole request's, never per choice
                        whole = tally.usage(prepared)
                        chunk = out.finish([item.choice], whole if i == last else None, whole)
                        if i == last:  # the run's timings and summary (LOC-CHAT-64)
                            chunk |= accepted.report(prepared, tally, item.end)
                        yield chunk
        except BaseException as exc:  # the client left, or the generation failed
            accepted.interrupted(prepared, request_id, exc)
            raise
        statement = steered.header(source)
        accepted.finished(prepared, tally, statement, steered.rung(source))
        if accepted.probes is not None:  # only while a probe is armed (OAI-PROBE-06)
            yield out.verdicts(await accepted.probes.record())
        if millm is not None:  # the activations, then the steering chunk (open point 19)
            yield out.millm(millm)
        yield out.last(statement, tally.usage(prepared))
