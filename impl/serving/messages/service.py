"""Anthropic's Messages API (`/v1/messages`): a message runs as a chat completion, its
answer shaped as a Message (or Anthropic's events); `count_tokens` renders the same chat.

Order is the chat path's (serving/completions/service.py): the field matrix and every
refusal before any load. A refusal names the Messages field (request.py `RENAMED`, and
each chat message's origin). A stream that fails after its start ends with an `error`
event in Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from ... import headers as hdr
from ...errors import ApiError
from ..admission import Admission
from ..completions.prepared import as_rendered
from ..completions.refusals import refusals
from ..completions.service import CompletionService
from ..relay import Sent, relayed
from ..renames import renamed
from ..results import Comment, Encoded, Reply, StreamReply, TypedStreamReply
from ..tokenizer.service import TokenizerService
from .request import MessagesAsk
from .shapes import Events, Message, from_chat, new_message_id


class MessagesService:
    def __init__(
        self, completions: CompletionService, tokenizer: TokenizerService, max_header_bytes: int
    ) -> None:
        self._completions = completions
        self._tokenizer = tokenizer
        self._max_header_bytes = max_header_bytes  # X-miLLM-Ignored-Fields' bound

    async def serve(self, ask: MessagesAsk, admission: Admission) -> Reply | TypedStreamReply:
        message = Message(id=new_message_id(), model=admission.entry.model_id)
        try:
            result = await self._completions.serve(ask.chat, admission)
        except ApiError as exc:
            raise ask.renamed(exc) from None
        if isinstance(result, StreamReply):
            events = self._events(ask, Events(message), result.events)
            return TypedStreamReply(events, result.headers)
        steering = result.headers.get(hdr.STEERING, "none")
        return Reply(from_chat(message, result.body, steering), result.headers)

    async def count(self, ask: MessagesAsk, admission: Admission) -> Reply:
        """The input tokens `ask` would be billed: its chat rendered as a message renders it
        (the same refusals, thinking and unused fields), nothing generated."""
        defaults = self._completions.defaults()
        try:
            unused, thinking = refusals(ask.chat, admission, defaults)
            chat = as_rendered(ask.chat, [*admission.ignored, *unused], thinking)
            count = await self._tokenizer.count(admission.entry, chat)
        except ApiError as exc:
            raise ask.renamed(exc) from None
        reported = [renamed(u, ask.chat.names) for u in unused]
        headers = admission.headers(reported, max_bytes=self._max_header_bytes)
        return Reply({"input_tokens": count}, headers)

    def _events(
        self,
        ask: MessagesAsk,
        events: Events,
        chunks: AsyncGenerator[dict[str, Any] | Encoded | Comment, None],
    ) -> AsyncGenerator[Sent, None]:
        """Anthropic's events, those one chat chunk makes together in one list (one write)."""
        return relayed(chunks, events.chunk, lambda exc: events.failed(ask.renamed(exc)), "message")
