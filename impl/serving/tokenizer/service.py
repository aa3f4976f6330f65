"""The tokenizer endpoints' service: which model, its engine, and the answers.

`model` names a model as on /v1; absent, the one loaded now (503 `no_model`
when none is). The loaded model's tokenizer answers at once, beside any
generation (`ModelManager.with_tokenizer`, as /api/detokenize does); a model
that is not loaded is loaded first, holding the slot as any /v1 request that
switches models does (serving/scheduler.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from ... import headers as hdr
from ...engines.base import Engine
from ...errors import ApiError
from ...generated import v1
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ...settings import Settings
from ..completions.defaults import RequestDefaults
from ..completions.requests import GenerationRequest
from ..policy import undeclared
from ..prompts import check_ids
from ..request_schemas import v1_schema
from ..results import Reply
from ..scheduler import Scheduler, holding
from .asks import TokenizeAsk, read, unused_headers
from .info import described


class TokenizerService:
    def __init__(
        self,
        settings: Settings,
        manager: ModelManager,
        scheduler: Scheduler,
        *,
        defaults: Callable[[], RequestDefaults] = RequestDefaults,
    ) -> None:
        self._settings = settings
        self._manager = manager
        self._scheduler = scheduler
        self._defaults = defaults  # the config's, read per request (a chat's thinking)

    async def tokenize(
        self, req: v1.TokenizeRequest, body: Mapping[str, Any], request_headers: Mapping[str, str]
    ) -> Reply:
        """POST /v1/tokenize: `{count, max_model_len, tokens, token_strs}`."""
        entry = self._entry(req.model)
        ask = read(
            req,
            body,
            entry,
            manager=self._manager,
            defaults=self._defaults(),
            request_headers=request_headers,
            max_bytes=self._settings.ignored_fields_header_max_bytes,
        )
        async with self._engine(entry) as engine:
            ids = await self._manager.with_tokenizer(partial(ask.ids, engine))
            strs = None
            if ask.token_strs:
                strs = await self._manager.with_tokenizer(partial(_pieces, engine, ids))
            window = engine.facts.context_length
        body = {"count": len(ids), "max_model_len": window, "tokens": ids, "token_strs": strs}
        return Reply(body, ask.headers)

    async def count(self, entry: ModelEntry, chat: GenerationRequest) -> int:
        """How many tokens `chat`'s one prompt is, its tools shown, as a completion renders it
        (POST /v1/messages/count_tokens); `entry` loaded first when it is not."""
        ask = TokenizeAsk(text=None, chat=chat, token_strs=False, headers={})
        async with self._engine(entry) as engine:
            return len(await self._manager.with_tokenizer(partial(ask.ids, engine)))

    async def detokenize(
        self, req: v1.DetokenizeRequest, body: Mapping[str, Any], request_headers: Mapping[str, str]
    ) -> Reply:
        """POST /v1/detokenize: `{prompt}`, the ids decoded together, special tokens kept."""
        ids = list(req.tokens)
        if ids:
            check_ids(ids, "tokens", None)  # a negative id, before any load
        entry = self._entry(req.model)
        stray = list(undeclared(body, v1_schema().named("DetokenizeRequest")))
        max_bytes = self._settings.ignored_fields_header_max_bytes
        headers = unused_headers(entry, stray, request_headers, max_bytes)
        async with self._engine(entry) as engine:
            if ids:
                check_ids(ids, "tokens", engine.facts.vocab_size)
            decode = partial(engine.decode, ids, keep_special=True)
            text = await self._manager.with_tokenizer(decode)
        return Reply({"prompt": text}, headers)

    async def info(self, model: str | None) -> Reply:
        """GET /v1/tokenizer_info."""
        entry = self._entry(model)
        async with self._engine(entry) as engine:
            body = await self._manager.with_tokenizer(partial(described, engine, entry))
        return Reply(body, {hdr.MODEL: entry.model_id})

    def _entry(self, model_id: str | None) -> ModelEntry:
        """The model named, or (none named) the one loaded now; refused before any load when
        the server is locked to another (OAI-MODELS-05)."""
        if model_id is None:
            self._manager.refuse_if_busy()
            resident = self._manager.resident
            if resident is None:
                raise ApiError(
                    "no_model", "No model is loaded: name one in `model`, or load one.", "model"
                )
            entry = resident.entry
        else:
            entry = self._manager.entry(model_id)
        self._manager.check_lock(entry)
        return entry

    @asynccontextmanager
    async def _engine(self, entry: ModelEntry) -> AsyncIterator[Engine]:
        """`entry`'s engine: the loaded one at once, else loaded under the slot (as /v1)."""
        engine = self._manager.engine_if_resident(entry)
        if engine is not None:
            yield engine
            return
        self._manager.refuse_if_busy()
        timeout = self._settings.graceful_unload_timeout
        async with holding(self._manager, self._scheduler, entry, timeout) as slot:
            yield slot.engine


def _pieces(engine: Engine, ids: Sequence[int]) -> list[str]:
    """Each id's own text, special tokens as their text (`Engine.token_text`, as
    /api/detokenize's pieces, serving/tokens.py)."""
    return [engine.token_text(token) for token in ids]
