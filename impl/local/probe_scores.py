"""`POST /api/probes/score`: probes read a text or a conversation, nothing generated.

`input` is read as one user message rendered through the model's chat template
(the text alone on a model without one); `messages` as a conversation of text
messages, without a generation's tools.

One forward pass over the prompt, on the engine's own generation path cut at
its first token (the last position's pick is never fed back), unsteered: no
steering hook is entered. Results are shaped as on a completion
(probes/watch.py), `served.backend` is `score`, and nothing is recorded in the
events: the caller asked, and has the answer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..engines.base import Capability, ChatPrompt, Engine, Hooks, SamplingParams
from ..errors import ApiError, InvalidParameter
from ..models.manager import ModelManager
from ..models.registry import ModelEntry
from ..probes.admin import ProbeAdmin
from ..probes.trace import fresh
from ..probes.watch import Served, Watch, Windows, shape
from ..serving.completions.prepared import prompt_ids, user_span
from ..serving.prompts import TextPrompt
from ..serving.scheduler import Scheduler, holding
from ..settings import Settings
from ..steering.live import LiveSteering

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _messages(raw: Sequence[Mapping[str, Any]]) -> ChatPrompt:
    """A conversation of `{role, content}` text messages, checked before any load."""
    for i, message in enumerate(raw):
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidParameter(
                f"messages[{i}].role", f"role must be one of {', '.join(sorted(ROLES))}."
            )
        if not isinstance(message.get("content"), str):
            raise InvalidParameter(f"messages[{i}].content", "content must be a string here.")
    return ChatPrompt(messages=[{"role": m["role"], "content": m["content"]} for m in raw])


def _user_message(engine: Engine, text: str) -> ChatPrompt | TextPrompt:
    """`input`: one user message through the chat template, the context probes are made
    in (tools/probe_train.py); the text alone on a model without a template."""
    if engine.facts.has_chat_template:
        return ChatPrompt(messages=[{"role": "user", "content": text}])
    return TextPrompt(text, True)


def _pass(engine: Engine, ids: list[int], watch: Watch) -> Any:
    """Blocking, in the engine's thread: the prompt's forward pass with the monitor hooked."""
    monitor = watch.monitor()
    if monitor is None:
        return None
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for _ in engine.generate(ids, params, None, Hooks(monitor=monitor)):
        pass
    return monitor


class ProbeScores:
    def __init__(
        self,
        settings: Settings,
        manager: ModelManager,
        scheduler: Scheduler,
        executor: Executor,
        *,
        live: LiveSteering,
        probes: ProbeAdmin,
    ) -> None:
        self._settings = settings
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor
        self._live = live
        self._probes = probes

    def _entry(self, model: str | None) -> ModelEntry:
        if model is not None:
            entry = self._manager.entry(model)
            self._manager.check_lock(entry)
            return entry
        resident = self._manager.resident
        if resident is None:
            raise ApiError("no_model", "No model is loaded; name one in `model`.", "model")
        return resident.entry

    async def score(
        self,
        *,
        model: str | None,
        text: str | None,
        messages: Sequence[Mapping[str, Any]] | None,
        names: Sequence[str] | None,
    ) -> dict[str, Any]:
        if (text is None) == (messages is None):
            raise InvalidParameter("input", "Send exactly one of `input` and `messages`.")
        chat = _messages(messages or []) if text is None else None
        probes = self._probes.named(names) if names else list(self._probes.armed())
        if not probes:
            raise InvalidParameter("probes", "No probe is armed: name the probes to read.")
        entry = self._entry(model)
        if Capability.GENERATE not in self._manager.capabilities(entry):
            raise InvalidParameter("model", f"`{entry.model_id}` does not generate text.")
        watch = Watch(probes, fresh())
        timeout = self._settings.graceful_unload_timeout
        async with holding(self._manager, self._scheduler, entry, timeout) as slot:
            engine = slot.engine
            prompt = chat if chat is not None else _user_message(engine, text or "")
            ids = await self._manager.with_tokenizer(partial(prompt_ids, engine, prompt))
            where = "input" if text is not None else "messages"
            if not ids:
                raise InvalidParameter(where, "The prompt tokenizes to nothing.")
            if len(ids) >= engine.facts.context_length:
                raise ApiError(
                    "context_length_exceeded",
                    f"The prompt is {len(ids)} tokens; the model's context is "
                    f"{engine.facts.context_length}.",
                    where,
                )
            watch.fit(shape(engine, entry.model_id, self._live))
            user: tuple[int, int] | None = (0, len(ids))
            if watch.needs_user:  # the render served, as on a completion (prepared.py)
                user = await self._manager.with_tokenizer(
                    partial(user_span, engine, prompt, ids, None)
                )
            loop = asyncio.get_running_loop()
            monitor = await loop.run_in_executor(self._executor, _pass, engine, ids, watch)
        served = Served(backend="score", engine=engine.facts.engine, model=entry.model_id)
        results = watch.results(
            monitor,
            Windows(prompt=len(ids), fed=0, user=user),
            index=0,
            served=served,
            request_id="probe-" + secrets.token_hex(12),
        )
        return {"object": "probe.score", "model": entry.model_id, "data": results}
