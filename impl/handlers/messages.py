"""Handlers of the `messages` tag (Anthropic's Messages API, contract 0.22.0).

Anthropic's conventions on these routes (its error shape and statuses, `x-api-key`,
`request-id`) are the HTTP layer's (http/anthropic.py); these handlers are the route's.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ..generated import v1
from ..serving.admission import Admission
from ..serving.messages.request import MessagesAsk, message_ask
from .common import admitted, parse, request_body, state, typed_response, unless_disconnected


async def create_message() -> Response:
    """POST /v1/messages."""
    ask, admission = _admitted(v1.CreateMessageRequest)
    return typed_response(await unless_disconnected(state().messages.serve(ask, admission)))


async def count_message_tokens() -> Response:
    """POST /v1/messages/count_tokens."""
    ask, admission = _admitted(v1.CountMessageTokensRequest)
    reply = await state().messages.count(ask, admission)
    return JSONResponse(reply.body, headers=reply.headers)


def _admitted(
    model: type[v1.CreateMessageRequest] | type[v1.CountMessageTokensRequest],
) -> tuple[MessagesAsk, Admission]:
    """The body read as `model`, let in to the Messages endpoint, and the chat it runs as."""
    body = request_body()
    req = parse(model, body)
    admission = admitted("messages", req.model, body)
    ask = message_ask(req)
    return ask, admission.reporting(ask.unused)
