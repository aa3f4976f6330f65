"""Chat and text completions: policy, slot, prompt, generation, response.

Order matters and is the contract's: the field policy and every refusal
that needs no model run before any load; the context-length check runs
before a stream starts; the slot is held while the engine generates.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

from ... import headers as hdr
from ...engines.base import (
    Batch,
    Capability,
    Engine,
    NonFiniteLogits,
    PrecisionUnavailable,
)
from ...errors import ApiError, FieldNotHonoured, InvalidParameter
from ...events import EventBus
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ...probes.admin import ProbeAdmin
from ...probes.trace import fresh
from ...probes.verdicts import order
from ...probes.verdicts import serialize as serialize_verdicts
from ...probes.watch import Served, Watch, Windows
from ...settings import Settings
from ...steering.live import LiveSteering
from ...steering.request import Resolution, resolve_steering
from ...steering.source import RequestSource
from ..admission import Admission
from ..chat.replies import Piece
from ..chat.response_format import check_combination
from ..chat.thinking import settle
from ..chat.tools import format_header
from ..prompts import TextPrompt, TokenPrompt
from ..results import Comment, Encoded, Reply, StreamReply
from ..scheduler import Scheduler, Slot, Ticket, claim, granted, holding
from ..telemetry import Meter
from . import shapes
from .activations import Reading, check_entries, read, resolve
from .batching import Batcher, Progress
from .defaults import RequestDefaults
from .generation import ChoiceEnd, ChoiceJob, TextDelta, choice_events
from .plan import Plan, Tally, is_short, job, prepare, user_span, without_unused
from .probing import shape
from .requests import GenerationRequest, with_thinking
from .scoring import (
    ScoringAsk,
    ScoringReply,
    check_mode,
    check_top_logprobs,
    check_vocabulary,
    unused_fields,
)

log = logging.getLogger(__name__)
_GONE = "client_disconnected"  # why a response that never went out whole ended


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
    ) -> None:
        self._probes = probes  # the armed probes, and where their results are recorded
        self._defaults = defaults  # the config's, read per request
        self._generating = generating  # counts a generation in /api/info while it runs
        self._bus = bus
        self._settings = settings
        self._live = live
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor
        self._batchers: weakref.WeakKeyDictionary[Batch, Batcher] = weakref.WeakKeyDictionary()

    async def serve(self, req: GenerationRequest, admission: Admission) -> Reply | StreamReply:
        """Answer one chat or text completion request: refusals first (none needs the model),
        then the config's defaults, then the scoring, JSON or streamed path."""
        defaults = self._defaults()  # the config read once: a queued request keeps what it saw
        unused, thinking = self._refusals(req, admission, defaults)
        headers = admission.headers(unused, self._settings.ignored_fields_header_max_bytes)
        if req.scoring is not None:
            check_mode(
                req.sent,
                max_tokens=req.max_tokens,
                n=req.n,
                stream=req.stream,
                temperature=req.scoring_temperature,
            )
            if req.seed is not None:  # accepted and echoed; it changes nothing (OAI-SEED-10)
                headers[hdr.SEED] = hdr.seed(req.seed, _seed_scope(req))
            reading = self._reading(req, admission.entry)
            self._manager.refuse_if_busy()
            plan = Plan(request=req, entry=admission.entry, defaults=defaults, reading=reading)
            return await self._score(plan, headers, req.scoring)
        reading = self._reading(req, admission.entry)
        echo = self._steering(req, admission.entry).echo
        if req.steering.intensity is not None and echo is not None:
            headers[hdr.STEERING_INTENSITY] = repr(float(echo))
        self._manager.refuse_if_busy()
        req = defaults.apply(req, seeds=Capability.SEED in admission.capabilities)
        if req.seed is not None:  # the request's, or the config's (docs/LOCAL.md)
            headers[hdr.SEED] = hdr.seed(req.seed, _seed_scope(req))
        if req.output is not None:
            headers[hdr.CONSTRAINED] = req.output.header()
        used = without_unused(req, [*admission.ignored, *unused])  # an unused field does nothing
        used = used if thinking is None else with_thinking(used, thinking)
        plan = Plan(
            request=used,
            entry=admission.entry,
            defaults=defaults,
            reading=reading,
            watch=self._watch(admission),
        )
        return await (self._stream(plan, headers) if req.stream else self._reply(plan, headers))

    def _refusals(
        self, req: GenerationRequest, admission: Admission, defaults: RequestDefaults
    ) -> tuple[list[str], bool | None]:
        """The cross-field refusals, after the field matrix's (so an engine refuses a field
        itself first); the fields they find unused, and whether a chat renders thinking."""
        check_top_logprobs(req.top_logprobs, req.scoring)
        if req.output is not None:
            check_combination(
                req.output,
                stops=bool(req.stops),
                scoring=req.scoring is not None,
                tools=req.tools is not None,
            )
        if req.tools is not None and req.scoring is not None:
            raise FieldNotHonoured("tools", "on scoring requests (nothing is generated)")
        if req.scoring is None and req.precision == "float32":
            raise InvalidParameter(
                "scoring_precision",
                'scoring_precision "float32" applies to scoring requests only '
                "(logprobs or allowed_token_ids, max_tokens: 1).",
            )
        if req.scoring is not None:
            unused = unused_fields(req.sent)
        else:  # `return_tokens_as_token_ids` keys scoring's tokens: nothing else uses it
            unused = ["return_tokens_as_token_ids"] if req.as_token_ids else []
        if req.endpoint != "chat" or not admission.honours("think"):
            return unused, None
        forced = req.tools is not None and req.tools.forced
        thinking, overridden = settle(  # LOC-CHAT-29
            req.think,
            defaults.think,
            constrained=req.output is not None or forced,
            kwargs_honoured=admission.honours("chat_template_kwargs"),
        )
        return [*unused, *overridden], thinking

    # -- activations -------------------------------------------------------------

    def _reading(self, req: GenerationRequest, entry: ModelEntry) -> Reading | None:
        """`return_sae_activations` resolved against the model's attachments; every refusal
        that needs no prompt, before any load or generation (OAI-ACT-16..22)."""
        ask = req.activations
        if ask is None:
            return None
        if req.n > 1:
            raise InvalidParameter(
                "n", "n above 1 cannot be combined with return_sae_activations (one reading)."
            )
        if len(req.prompts) > 1:
            param = "extra_messages" if req.endpoint == "chat" else "prompt"
            raise InvalidParameter(
                param,
                "several prompts cannot be combined with return_sae_activations: there is "
                "no single position axis.",
            )
        if req.precision == "float32":  # OAI-F32-22
            raise InvalidParameter(
                "scoring_precision",
                'scoring_precision "float32" cannot be combined with return_sae_activations.',
            )
        attached = [(a.sae.sae_id, a.layer, a.sae) for a in self._live.attachments(entry.model_id)]
        return resolve(ask, attached, max_top_k=self._settings.sae_activations_max_top_k)

    def _check_entries(self, plan: Plan) -> None:
        """The worst-case entry count, once the prompt's length is known (OAI-ACT-23)."""
        if plan.reading is not None:
            check_entries(
                plan.reading.ask,
                prompt_tokens=len(plan.prompt_ids[0]),
                max_tokens=plan.budgets[0],
                max_entries=self._settings.sae_activations_max_entries,
            )

    def _millm(self, plan: Plan, end: ChoiceEnd) -> dict[str, Any] | None:
        """The `millm` object of a reading request's response; None when none was asked."""
        if plan.reading is None or end.captured is None:
            return None
        captured = end.captured
        prompt_tokens = len(plan.prompt_ids[0])
        body = read(plan.reading, captured.rows, captured.token_ids, prompt_tokens)
        return {"sae_activations": body}

    # -- probes ------------------------------------------------------------------

    def _watch(self, admission: Admission) -> Watch | None:
        """The probes armed as the request came in; None while none is: the response is
        then what it would be without probes, byte for byte (OAI-PROBE-06)."""
        armed = () if self._probes is None else self._probes.armed()
        return Watch(armed, admission.trace_id or fresh()) if armed else None

    async def _prepared(self, plan: Plan, engine: Engine) -> None:
        """What needs the prompts' ids: the activations' entry count, and the armed
        probes resolved against the model with their `last_user` windows."""
        self._check_entries(plan)
        watch = plan.watch
        if watch is None:
            return
        watch.resolve(shape(engine, plan.entry.model_id, self._live))
        plan.user_spans = [None] * len(plan.prompt_ids)
        if watch.needs_user:
            for i, prompt in enumerate(plan.request.prompts):
                span = partial(user_span, plan, engine, i)
                inline = is_short(prompt, plan.tools)
                plan.user_spans[i] = await self._manager.tokenize(span, inline=inline)

    def _verdicts(
        self,
        plan: Plan,
        engine: Engine,
        run: Started,
        request_id: str,
        end: ChoiceEnd | None,
        interrupted: str = _GONE,
    ) -> list[dict[str, Any]]:
        """One choice's probe results; `end` None: it ended early, `interrupted` says why."""
        watch = plan.watch
        if watch is None:
            return []
        fed = INTERRUPTED_FED if end is None else max(0, end.completion_tokens - 1)
        user = plan.user_spans[run.prompt] if plan.user_spans else None
        windows = Windows(prompt=len(plan.prompt_ids[run.prompt]), fed=fed, user=user)
        served = Served(
            backend="batch" if run.ticket.shared else "serial",
            engine=engine.facts.engine,
            model=plan.entry.model_id,
        )
        return watch.results(
            run.job.monitor,
            windows,
            index=run.index,
            served=served,
            request_id=request_id,
            interrupted=None if end is not None else interrupted,
        )

    def _record_interrupted(
        self, plan: Plan, engine: Engine, runs: list[Started], request_id: str, reason: str
    ) -> None:
        """A response that never went out whole: every started choice's results, recorded
        as `interrupted` and never sent (OAI-PROBE-09)."""
        if plan.watch is None or self._probes is None or not runs:
            return
        results = []
        for run in runs:
            results.extend(self._verdicts(plan, engine, run, request_id, None, reason))
        try:
            self._probes.record(sorted(results, key=order))
        except Exception:  # the response has failed already; its results are logged instead
            log.exception("recording %d interrupted probe results failed", len(results))

    async def _record(self, results: list[dict[str, Any]]) -> None:
        if self._probes is not None and results:
            await asyncio.to_thread(self._probes.record, results)

    # -- steering ----------------------------------------------------------------

    def _steering(self, req: GenerationRequest, entry: ModelEntry) -> Resolution:
        """The request's steering against the live state; its refusals come before any load."""
        if Capability.STEERING not in self._manager.capabilities(entry):
            return Resolution(None)  # the policy refused the steering fields already
        resident = self._manager.engine_if_resident(entry) is not None
        return resolve_steering(req.steering, self._live, entry.model_id, resident)

    def _start_steering(self, plan: Plan, engine: Engine) -> None:
        """Resolve again now that the slot is held: the state may have moved while queued."""
        if Capability.STEERING in engine.capabilities:
            resolved = resolve_steering(
                plan.request.steering, self._live, plan.entry.model_id, True
            )
            plan.steering = RequestSource(self._live, plan.entry.model_id, resolved.override)

    # -- scoring -----------------------------------------------------------------

    async def _score(self, plan: Plan, headers: dict[str, str], ask: ScoringAsk) -> Reply:
        """One unsteered forward pass per prompt; nothing generated (OAI-SCORE, OAI-CSCORE).
        Beside a batch it holds a row's place and runs between two steps, with no row's
        steering hooked (SCORE-35)."""
        resident = self._manager.engine_if_resident(plan.entry)
        shared = resident is not None and resident.batch is not None
        async with self._holding(plan.entry, shared=shared) as slot:
            engine = slot.engine
            if plan.request.endpoint == "chat" and not engine.facts.has_chat_template:
                raise ApiError(
                    "no_chat_template",
                    f"`{plan.entry.model_id}` has no chat template, so chat scoring has no "
                    "prompt to score (generation falls back to a generic template; a judge's "
                    "probabilities must not). Score the rendered text on /v1/completions.",
                    "messages",
                )
            check_vocabulary(ask, engine.facts.vocab_size)
            await prepare(plan, engine, self._manager)
            self._check_entries(plan)
            loop = asyncio.get_running_loop()
            choices, millm = await loop.run_in_executor(
                self._executor, self._scored, plan, engine, ask
            )
        env = shapes.Envelope.new(plan.request.endpoint, plan.entry.model_id)
        usage = shapes.usage(sum(len(ids) for ids in plan.prompt_ids), len(choices))
        body = env.body(choices, usage, shapes.fingerprint(engine.facts))
        if millm is not None:
            body["millm"] = millm
        headers = {**headers, hdr.STEERING: "none"}
        if ask.precision is not None:  # echoed only when sent (OAI-F32-10)
            body["scoring_precision"] = ask.precision
            headers[hdr.SCORING_PRECISION] = ask.precision
        return Reply(body, headers)

    def _scored(
        self, plan: Plan, engine: Engine, ask: ScoringAsk
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Blocking, in the engine's thread: score every prompt and shape its choice; the
        `millm` object of a reading request (its one prompt's pass, unsteered)."""
        r = plan.request
        query = ask.query(r.endpoint, r.scoring_temperature)
        reply = ScoringReply(r.endpoint, ask, engine.token_text)
        choices = []
        millm = None
        for i, (prompt, ids) in enumerate(zip(r.prompts, plan.prompt_ids, strict=True)):
            try:
                if plan.reading is None:
                    result = engine.score(ids, query)
                else:  # the scoring pass runs no steering hook: the read point is `unsteered`
                    with engine.capturing(plan.reading.layer, pre_steering=True) as residuals:
                        result = engine.score(ids, query)
                    millm = {
                        "sae_activations": read(
                            plan.reading, residuals.rows(), ids, len(ids), read_point="unsteered"
                        )
                    }
            except NonFiniteLogits as exc:
                raise ApiError(
                    "non_finite_logits",
                    f"The model produced non-finite logits for prompt {i}: {exc}.",
                    None,
                ) from exc
            except PrecisionUnavailable as exc:
                raise ApiError(
                    "scoring_precision_unavailable",
                    f"float32 scoring cannot be served ({exc.reason}): {exc}.",
                    "scoring_precision",
                    headers={hdr.SCORING_PRECISION_REASON: exc.reason},
                ) from exc
            chars = 0  # a chat's offset; a token prompt's is the text its ids stand for
            if isinstance(prompt, TextPrompt):
                chars = len(prompt.text)
            elif isinstance(prompt, TokenPrompt):
                chars = len(engine.decode(prompt.ids, keep_special=True))
            choices.append(reply.choice(i, result, chars))
        return choices, millm

    # -- non-streamed ------------------------------------------------------------

    def _holding(self, entry: ModelEntry, *, shared: bool) -> AbstractAsyncContextManager[Slot]:
        """The slot with `entry` resident for a block (serving/scheduler.py); `shared`: a row."""
        switch_timeout = self._settings.graceful_unload_timeout
        return holding(self._manager, self._scheduler, entry, switch_timeout, shared=shared)

    def _as_row(self, plan: Plan) -> bool:
        """Whether the request's choices decode as rows of the resident engine's batch
        (docs/DECISIONS.md, continuous batching): a prepared request whose every prompt and
        budget fit a row, unless seeded: a seed's byte-identical promise holds only on the
        serial path (OAI-CBM-08)."""
        engine = plan.prepared_for
        batch = None if engine is None else engine.batch
        if batch is None or plan.request.seed is not None or plan.reading is not None:
            return False  # a reading captures one layer of the serial path (OAI-ACT-25)
        if engine is not self._manager.engine_if_resident(plan.entry):
            return False
        sizes = zip(plan.prompt_ids, plan.budgets, strict=True)
        return all(len(ids) + budget <= batch.window for ids, budget in sizes)

    def _choice_events(
        self, engine: Engine, job: ChoiceJob, ticket: Ticket, pace: float = 0.0
    ) -> AsyncIterator[TextDelta | ChoiceEnd]:
        """One choice's events: a row of the batch when the ticket is a row, else alone, its
        text pieces read at most every `pace` seconds (`generation.Inbox`)."""
        batch = engine.batch
        if not ticket.shared or batch is None:
            return choice_events(engine, job, self._executor, pace)
        batcher = self._batchers.get(batch)
        if batcher is None:
            progress = Progress(publish=self._bus.publish)
            batcher = Batcher(engine, batch, self._executor, progress)
            self._batchers[batch] = batcher
        return batcher.events(job, pace)

    async def _reply(self, plan: Plan, headers: dict[str, str]) -> Reply:
        resident = self._manager.engine_if_resident(plan.entry)
        if resident is not None:  # prepared first: whether it runs as a row needs its sizes
            await prepare(plan, resident, self._manager)
            await self._prepared(plan, resident)
        env = shapes.Envelope.new(plan.request.endpoint, plan.entry.model_id)
        runs: list[Started] = []
        async with self._holding(plan.entry, shared=self._as_row(plan)) as slot:
            engine = slot.engine
            if plan.prepared_for is not engine:
                await prepare(plan, engine, self._manager)
                await self._prepared(plan, engine)
            self._start_steering(plan, engine)
            try:
                with self._generating():
                    choices, tally, last, verdicts = await self._generate_all(
                        plan, engine, slot.ticket, env.id, runs
                    )
            except BaseException as exc:  # the client left, or the generation failed
                reason = "generation_failed" if isinstance(exc, Exception) else _GONE
                self._record_interrupted(plan, engine, runs, env.id, reason)
                raise
        body = env.body(choices, tally.usage(plan), shapes.fingerprint(engine.facts))
        millm = None if last is None else self._millm(plan, last)
        if millm is not None:  # only when asked: no `millm` key otherwise (OAI-ACT-15)
            body["millm"] = millm
        steering = plan.steering_header()
        headers = {**headers, **format_header(plan.tools), hdr.STEERING: steering}
        rung = plan.rung_header()
        if rung is not None:  # only when a circuit steered (OAI-RUNG-01, RUNG-09..17)
            headers[hdr.CIRCUIT_RUNG] = rung
        if plan.watch is not None:  # only while a probe is armed (OAI-PROBE-06)
            body["millm_probe_verdicts"] = verdicts
            headers[hdr.PROBE_VERDICTS] = serialize_verdicts(verdicts, choices=len(choices))
            await self._record(verdicts)
        return Reply(body, headers)

    def _meter(self, plan: Plan, i: int) -> Meter:
        """Token and done telemetry; the per-token readings only while someone listens to
        /api/events (the `done` summary always: the planner's `measured` reads it)."""
        return Meter(
            emit=self._bus.publish,
            steps=plan.budgets[i],
            n_prompt=len(plan.prompt_ids[i]),
            load_s=self._manager.load_seconds,
            quiet=not self._bus.listening,
        )

    async def _generate_all(
        self, plan: Plan, engine: Engine, ticket: Ticket, request_id: str, runs: list[Started]
    ) -> tuple[list[dict[str, Any]], Tally, ChoiceEnd | None, list[dict[str, Any]]]:
        """Every choice, the counts, the last choice's end (a reading's rows ride on it), and
        the probe results, sorted (`runs` collects the choices as they start)."""
        r = plan.request
        choices: list[dict[str, Any]] = []
        tally = Tally()
        end: ChoiceEnd | None = None
        verdicts: list[dict[str, Any]] = []
        for i in range(len(r.prompts)):
            rng = engine.new_rng(r.seed)
            for k in range(r.n):
                work = job(plan, i, rng, ticket, meter=self._meter(plan, i))
                run = Started(job=work, index=len(choices), prompt=i, ticket=ticket)
                runs.append(run)
                text, end = await self._collect(self._choice_events(engine, work, ticket))
                choices.append(plan.choice(len(choices), text, end.finish_reason))
                tally.add(end, first_of_prompt=k == 0)
                verdicts.extend(self._verdicts(plan, engine, run, request_id, end))
        return choices, tally, end, sorted(verdicts, key=order)

    async def _collect(self, events: AsyncIterator[TextDelta | ChoiceEnd]) -> tuple[str, ChoiceEnd]:
        parts: list[str] = []
        async for event in events:
            if isinstance(event, TextDelta):
                parts.append(event.text)
            else:
                return "".join(parts), event
        raise RuntimeError("generation ended without an end event")

    # -- streamed ----------------------------------------------------------------

    async def _stream(self, plan: Plan, headers: dict[str, str]) -> StreamReply:
        """Every refusal happens here, before the stream (and its 200) starts.

        The slot is taken one of two ways. A model that must be loaded first is
        loaded, holding the slot, before the 200: a failed load is a status, not an
        event. A resident model's request takes its place in line here and waits
        inside the stream, which sends `: waiting for a turn` comments meanwhile.
        Either way the ticket is given back once (`leave` is idempotent): by the
        stream when it ends, or, for a stream whose body never starts (the client
        left first), when its generator is collected; a failed `prepare` gives it
        back at once.
        """
        engine = self._manager.engine_if_resident(plan.entry)
        if engine is None:
            switch_timeout = self._settings.graceful_unload_timeout
            slot = await claim(self._manager, self._scheduler, plan.entry, switch_timeout)
            ticket, engine = slot.ticket, slot.engine
            try:
                await prepare(plan, engine, self._manager)
                await self._prepared(plan, engine)
            except BaseException:
                self._scheduler.leave(ticket)
                raise
        else:
            await prepare(plan, engine, self._manager)
            await self._prepared(plan, engine)
            ticket = self._scheduler.enter(shared=self._as_row(plan))
        events = self._events(plan, ticket)
        # A stream whose body never starts (client gone first) still gives its place back.
        loop = asyncio.get_running_loop()
        weakref.finalize(events, loop.call_soon_threadsafe, self._scheduler.leave, ticket)
        return StreamReply(events, {**headers, **format_header(plan.tools)})

    async def _events(
        self, plan: Plan, ticket: Ticket
    ) -> AsyncGenerator[dict[str, Any] | Encoded | Comment, None]:
        try:
            while not await self._scheduler.wait(ticket, self._settings.queue_heartbeat):
                yield Comment("waiting for a turn")
            switch_timeout = self._settings.graceful_unload_timeout
            slot = await granted(self._manager, self._scheduler, ticket, plan.entry, switch_timeout)
            ticket, engine = slot.ticket, slot.engine
            if plan.prepared_for is not engine:  # reloaded while this request waited
                await prepare(plan, engine, self._manager)
                await self._prepared(plan, engine)
            self._start_steering(plan, engine)
            env = shapes.Envelope.new(plan.request.endpoint, plan.entry.model_id)
            out = env.chunks(shapes.fingerprint(engine.facts), plan.request.include_usage)
            async for chunk in self._streamed(plan, engine, out, ticket):
                yield chunk
        finally:
            self._scheduler.leave(ticket)

    async def _streamed(
        self, plan: Plan, engine: Engine, out: shapes.Chunks, ticket: Ticket
    ) -> AsyncIterator[dict[str, Any] | Encoded]:
        """The stream's chunks once the slot is held: the choices, then the probe verdicts,
        the activations and the steering chunk (OAI-PROBE-08, open point 19). A stream that
        ends early records its probe results as `interrupted` (OAI-PROBE-09)."""
        tally = Tally()
        last = len(plan.request.prompts) - 1
        millm = None
        runs: list[Started] = []
        verdicts: list[dict[str, Any]] = []
        request_id = out.envelope.id
        try:
            with self._generating():
                for i in range(last + 1):
                    chunks = self._choice_chunks(plan, engine, out, i, ticket=ticket, runs=runs)
                    async for item in chunks:
                        if isinstance(item, _Finished):
                            tally.add(item.end, first_of_prompt=True)
                            millm = self._millm(plan, item.end)
                            verdicts.extend(
                                self._verdicts(plan, engine, runs[-1], request_id, item.end)
                            )
                            # one usage per stream: the whole request's, never per choice
                            usage = tally.usage(plan) if i == last else None
                            yield out.finish([item.choice], usage)
                        else:
                            yield item
        except BaseException as exc:  # the client left, or the generation failed
            reason = "generation_failed" if isinstance(exc, Exception) else _GONE
            self._record_interrupted(plan, engine, runs, request_id, reason)
            raise
        if plan.watch is not None:  # only while a probe is armed (OAI-PROBE-06)
            verdicts.sort(key=order)
            await self._record(verdicts)
            yield out.verdicts(verdicts)
        if millm is not None:  # the activations, then the steering chunk (open point 19)
            yield out.millm(millm)
        yield out.last(plan.steering_header(), tally.usage(plan))

    async def _choice_chunks(
        self,
        plan: Plan,
        engine: Engine,
        out: shapes.Chunks,
        i: int,
        *,
        ticket: Ticket,
        runs: list[Started],
    ) -> AsyncIterator[dict[str, Any] | Encoded | _Finished]:
        """Prompt i's content chunks, then its finish (the caller adds the usage); the
        choice joins `runs` as it starts."""
        endpoint = plan.request.endpoint
        work = job(plan, i, engine.new_rng(plan.request.seed), ticket, meter=self._meter(plan, i))
        runs.append(Started(job=work, index=i, prompt=i, ticket=ticket))
        pace = self._settings.stream_interval
        events = self._choice_events(engine, work, ticket, pace)  # it starts as the role goes out
        if endpoint == "chat":
            yield out.content([shapes.delta(endpoint, i, "", None, role=True)])
        reply = plan.reply_stream(i)
        output = plan.output
        document: list[str] = []  # a constrained reply, validated once it ends
        async for event in events:
            if isinstance(event, TextDelta):
                if output is not None:
                    document.append(event.text)
                if piece := reply.push(event.text):
                    plain = piece.content and not piece.reasoning  # most tokens: made quickly
                    yield (
                        out.text(i, piece.content)
                        if plain
                        else out.content([_delta(endpoint, i, piece)])
                    )
            else:
                reason = event.finish_reason
                if output is not None:  # an invalid document ends the stream in an error
                    reason = output.finish("".join(document), reason)
                piece, calls = reply.finish()
                if piece:
                    yield out.content([_delta(endpoint, i, piece)])
                if calls:  # the calls whole, in one delta (OAI-TOOLS-06)
                    yield out.content([shapes.delta(endpoint, i, None, None, calls=calls)])
                    reason = "tool_calls"
                yield _Finished(shapes.delta(endpoint, i, None, reason), event)
                return


INTERRUPTED_FED = 2**62  # an ended-early choice's window reads every value its monitor got


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """A choice whose generation started: what its probe results need."""

    job: ChoiceJob
    index: int  # the choice's index in the response
    prompt: int  # its prompt's index
    ticket: Ticket


@dataclass(frozen=True, slots=True)
class _Finished:
    """A streamed choice's finish: its last chunk's choice and its counts."""

    choice: dict[str, Any]
    end: ChoiceEnd


def _seed_scope(req: GenerationRequest) -> str:
    """`X-miLLM-Seed`'s scope: `batch-shape` for `extra_messages` rows (OAI-SEED-06)."""
    return "batch-shape" if req.endpoint == "chat" and len(req.prompts) > 1 else "request"


def _delta(endpoint: str, i: int, piece: Piece) -> dict[str, Any]:
    """A chunk's choice for `piece`: its content and its reasoning (LOC-CHAT-57)."""
    return shapes.delta(endpoint, i, piece.content or None, None, reasoning=piece.reasoning or None)
