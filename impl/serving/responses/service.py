"""The Responses API (`/v1/responses`): a response runs as a chat completion, its answer
shaped as a Response (or its typed events), and kept while `store` says so.

Order is the chat path's (serving/completions/service.py): the field matrix and every
refusal before any load; the stored conversation `previous_response_id` names is read
before the model is touched. A refusal names the Responses field (request.py `RENAMED`).
A stream that fails after its start ends with an `error` event and `response.failed`,
and the failed response is kept as it stood.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from functools import partial
from typing import Any

from ... import headers as hdr
from ...errors import ApiError
from ...generated import v1
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ...store.responses import ResponseNotFound, ResponseStore, StoredResponse
from ..admission import Admission
from ..completions.service import CompletionService
from ..relay import Sent, relayed
from ..results import Comment, Encoded, Reply, StreamReply, TypedStreamReply
from .request import ResponseAsk, renamed, response_ask, sampled
from .shapes import Events, Response, from_chat, new_response_id

log = logging.getLogger(__name__)


class ResponsesService:
    def __init__(
        self, completions: CompletionService, store: ResponseStore, manager: ModelManager
    ) -> None:
        self._completions = completions
        self._manager = manager  # the resident engine's tokenizer counts reasoning tokens
        self.store = store

    async def ask(self, req: v1.CreateResponseRequest) -> ResponseAsk:
        """The request on the conversation its `previous_response_id` continues, its
        sampling the config's where it sends none (the Response echoes what ran)."""
        previous: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            try:
                stored = await asyncio.to_thread(self.store.get, req.previous_response_id)
                previous = stored.context()
            except ResponseNotFound:
                raise ApiError(
                    "previous_response_not_found",
                    f"No stored response has the id `{req.previous_response_id}` (it was "
                    "never stored, was deleted, or was dropped past the store's bound).",
                    "previous_response_id",
                ) from None
        return sampled(response_ask(req, previous), self._completions.defaults())

    async def serve(self, ask: ResponseAsk, admission: Admission) -> Reply | TypedStreamReply:
        response = Response(id=new_response_id(), model=admission.entry.model_id, echo=ask.echo)
        try:
            result = await self._completions.serve(ask.chat, admission)
        except ApiError as exc:
            raise renamed(exc) from None
        count = partial(self._tokens, admission.entry)
        if isinstance(result, StreamReply):
            events = self._events(ask, Events(response, count), result.events)
            return TypedStreamReply(events, result.headers)
        body = from_chat(response, result.body, count)
        body["millm_steering"] = result.headers.get(hdr.STEERING, "none")
        await self._keep(ask, body)
        return Reply(body, result.headers)

    def _tokens(self, entry: ModelEntry, text: str) -> int:
        """How many tokens `text` is to the model that answered (0 once it is gone)."""
        engine = self._manager.engine_if_resident(entry)
        return 0 if engine is None else len(engine.tokenize(text, add_special_tokens=False))

    async def _events(
        self,
        ask: ResponseAsk,
        events: Events,
        chunks: AsyncGenerator[dict[str, Any] | Encoded | Comment, None],
    ) -> AsyncGenerator[Sent, None]:
        """The typed events, those one chat chunk makes together in one list (one write)."""
        yield list(events.started())

        def failed(exc: ApiError) -> Iterator[dict[str, Any]]:
            return events.failed(renamed(exc))

        async with aclosing(relayed(chunks, events.chunk, failed, "response")) as relay:
            async for sent in relay:  # closed with this stream: a client that leaves frees it
                yield sent
        await self._keep(ask, events.final())

    async def _keep(self, ask: ResponseAsk, body: dict[str, Any]) -> None:
        """Store the response (off the event loop: a write waits on the disk)."""
        if not ask.store:
            return
        stored = StoredResponse(
            id=body["id"],
            response=body,
            input_items=ask.input_items,
            conversation=ask.conversation,
            created=float(body["created_at"]),
        )
        await asyncio.to_thread(self.store.save, stored)
