"""`POST /api/decide` (LOC-DECIDE): which choice the model would answer next.

`prefix + suffix` is one user message through the model's chat template
with reasoning off; the choices are scored by their first token over the
whole vocabulary, from one prefill and no decode. With `reuse_prefix` the
state after the prefix is kept for the next decision that extends it. A
decision waits its turn in the same queue as a chat turn; `POST /api/cancel`
stops it between prefill chunks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..engines.base import Capability, Decision, Engine
from ..engines.capabilities import Decider
from ..errors import ApiError
from ..models.manager import ModelManager
from ..serving.scheduler import Scheduler

log = logging.getLogger(__name__)

# The answer's flash and device keys (LOC-DECIDE-15): this engine streams nothing from flash.
UNUSED_KEYS: dict[str, float | int] = {
    "prefill_read_mib": 0.0,
    "prefill_io_s": 0.0,
    "prefill_stall_s": 0.0,
    "prefill_mgmt_s": 0.0,
    "prefill_dev_tokens": 0,
    "prefill_dev_read_mib": 0.0,
    "prefill_dev_stall_s": 0.0,
    "prefill_dev_routed": 0,
    "prefill_dev_demand": 0,
}


def _refuse(message: str, param: str | None) -> ApiError:
    return ApiError("invalid_request", message, param)


def answer(decision: Decision) -> dict[str, Any]:
    """The answer in the CLI's BMOE_DECIDE keys (LOC-DECIDE-13)."""
    logps = list(decision.logps)
    finite = [i for i, lp in enumerate(logps) if lp is not None]
    best = max(finite, key=lambda i: logps[i] or 0.0) if finite else None
    return {
        "cancelled": decision.cancelled,
        "best": best,
        "choice_logp": logps,
        "n_tokens": decision.n_tokens,
        "n_reused": decision.n_reused,
        "n_prefilled": decision.n_prefilled,
        "restore_s": decision.restore_s,
        "store_s": decision.store_s,
        "prefill_s": decision.prefill_s,
        "prefill_cpu_s": decision.prefill_cpu_s,
        **UNUSED_KEYS,
        "prefix_state_mib": decision.prefix_state_mib,
    }


class DecisionService:
    def __init__(
        self,
        manager: ModelManager,
        scheduler: Scheduler,
        executor: Executor,
        *,
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        """`enabled`: the session's `decide` parameter (LOC-DECIDE-24)."""
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor
        self.enabled = enabled

    def _engine(self) -> Decider:
        resident = self._manager.resident
        if resident is None:
            raise ApiError("no_model", "No model is loaded to decide with.", None)
        if not self.enabled():  # LOC-DECIDE-24
            raise _refuse(
                "Decisions are off in this session: set the `decide` parameter "
                "(PUT /api/config) and reload the model.",
                None,
            )
        entry, engine = resident.entry, resident.engine
        if Capability.DECIDE not in engine.capabilities or not isinstance(engine, Decider):
            raise _refuse(
                f"The loaded model `{entry.model_id}` runs on {entry.engine}, which does not "
                "decide yet; load a transformers model.",
                None,
            )
        return engine

    async def _first_ids(self, engine: Engine, choices: Sequence[str]) -> list[int]:
        if not choices:
            raise _refuse("choices is empty: there is nothing to decide between.", "choices")
        firsts: list[int] = []
        for i, choice in enumerate(choices):
            ids = await self._manager.with_tokenizer(
                partial(engine.tokenize, choice, add_special_tokens=False)
            )
            if not ids:
                raise _refuse(f"choices[{i}] tokenizes to nothing.", f"choices[{i}]")
            if ids[0] in firsts:
                j = firsts.index(ids[0])
                raise _refuse(
                    f"choices[{j}] and choices[{i}] share their first token "
                    f"({engine.token_text(ids[0])!r}); choices are told apart by it.",
                    f"choices[{i}]",
                )
            firsts.append(ids[0])
        return firsts

    async def decide(
        self, prefix: str, suffix: str, choices: Sequence[str], reuse: bool
    ) -> dict[str, Any]:
        engine = self._engine()
        firsts = await self._first_ids(engine, choices)
        ids, prefix_length = await self._manager.with_tokenizer(
            partial(engine.render_split, prefix, suffix)
        )
        limit = engine.facts.context_length
        if limit and len(ids) >= limit:
            raise ApiError(
                "context_length_exceeded",
                f"The decision's prompt is {len(ids)} tokens; the model's context is {limit}.",
                "prefix",
            )
        async with self._scheduler.hold() as ticket:
            if self._engine() is not engine:
                raise ApiError("model_busy", "The model changed while the decision waited.", None)
            loop = asyncio.get_running_loop()
            prefill = partial(
                engine.prefill_choices,
                ids,
                prefix_length,
                firsts,
                reuse=reuse,
                cancel=ticket.cancel,
            )
            decision = await loop.run_in_executor(self._executor, prefill)
        return answer(decision)
