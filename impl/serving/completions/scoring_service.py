"""A scoring request's path: one unsteered forward pass per prompt, nothing generated
(OAI-SCORE, OAI-CSCORE).

Beside a batch it holds a row's place and runs between two steps, with no
row's steering hooked (SCORE-35). A reading request's one prompt is read in
the same pass, `unsteered` (OAI-ACT-11). The request side (its fields, its
refusals, the shape of its choices) is scoring.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

from ... import headers as hdr
from ...engines.base import (
    Capture,
    NonFiniteLogits,
    PrecisionUnavailable,
    Scored,
    ScoreQuery,
)
from ...engines.capabilities import Scorer
from ...errors import ApiError, FieldNotHonoured
from ...models.manager import ModelManager
from ...settings import Settings
from ..results import Reply
from ..scheduler import Scheduler, holding
from . import shapes
from .accepted import Accepted
from .prepared import Prepared, prepare, prompt_text
from .reading import read
from .scoring import ScoringAsk, ScoringReply, check_vocabulary


class ScoringService:
    def __init__(
        self, settings: Settings, manager: ModelManager, scheduler: Scheduler, executor: Executor
    ) -> None:
        self._settings = settings
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor

    async def score(self, accepted: Accepted, headers: dict[str, str], ask: ScoringAsk) -> Reply:
        """The scoring reply: a choice per prompt, and the reading's `millm` when asked."""
        entry = accepted.entry
        resident = self._manager.engine_if_resident(entry)
        shared = resident is not None and resident.batch is not None
        timeout = self._settings.graceful_unload_timeout
        async with holding(self._manager, self._scheduler, entry, timeout, shared=shared) as slot:
            engine = slot.engine
            if accepted.request.endpoint == "chat" and not engine.facts.has_chat_template:
                raise ApiError(
                    "no_chat_template",
                    f"`{entry.model_id}` has no chat template, so chat scoring has no "
                    "prompt to score (generation falls back to a generic template; a judge's "
                    "probabilities must not). Score the rendered text on /v1/completions.",
                    "messages",
                )
            check_vocabulary(ask, engine.facts.vocab_size)
            prepared = await prepare(accepted.request, engine, self._manager, accepted.defaults)
            if accepted.reading is not None:
                limit = self._settings.sae_activations_max_entries
                accepted.reading.check(prepared, max_entries=limit)
            loop = asyncio.get_running_loop()
            choices, millm, cached = await loop.run_in_executor(
                self._executor, self._scored, accepted, prepared, ask
            )
        env = shapes.Envelope.new(accepted.request.endpoint, entry.model_id)
        usage = shapes.usage(prepared.prompt_tokens, len(choices), cached)
        body = env.body(choices, usage, shapes.fingerprint(engine.facts))
        if millm is not None:
            body["millm"] = millm
        headers = {**headers, hdr.STEERING: "none"}
        if ask.precision is not None:  # echoed only when sent (OAI-F32-10)
            body["scoring_precision"] = ask.precision
            headers[hdr.SCORING_PRECISION] = ask.precision
        return Reply(body, headers)

    def _scored(
        self, accepted: Accepted, prepared: Prepared, ask: ScoringAsk
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
        """Blocking, in the engine's thread: score every prompt and shape its choice; the
        `millm` object of a reading request (its one prompt's pass, unsteered); the prompt
        tokens the KV held (`usage.prompt_tokens_details.cached_tokens`)."""
        r, engine, reading = accepted.request, prepared.engine, accepted.reading
        if not isinstance(engine, Scorer):  # the field matrix refused scoring already
            raise FieldNotHonoured("logprobs", f"by the {engine.facts.engine} engine")
        query = replace(
            ask.query(r.endpoint, r.scoring_temperature),
            reuse=self._settings.scoring_cache,
        )
        reply = ScoringReply(r.endpoint, ask, engine.token_text)
        choices = []
        millm = None
        cached = 0
        for i, (prompt, ids) in enumerate(zip(r.prompts, prepared.prompt_ids, strict=True)):
            # the pass runs no steering hook: read ahead of any hook on the layer, `unsteered`
            capture = None if reading is None else Capture(reading.layer, pre_steering=True)
            result = _pass(engine, i, ids, query, capture)
            if capture is not None and reading is not None:  # the read point is `unsteered`
                body = read(reading, capture.rows, ids, len(ids), read_point="unsteered")
                millm = {"sae_activations": body}
            choices.append(reply.choice(i, result, prompt_text(engine, prompt), ids))
            cached += result.cached_tokens
        return choices, millm, cached


def _pass(
    engine: Scorer, i: int, ids: Sequence[int], query: ScoreQuery, capture: Capture | None
) -> Scored:
    """Prompt i's scoring pass; the engine's refusals as the API's errors."""
    try:
        return engine.score(ids, query, capture)
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
