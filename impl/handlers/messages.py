"""Handlers of the `messages` tag (Anthropic's Messages API, contract 0.22.0).

Anthropic's conventions on these routes (its error shape and statuses, `x-api-key`,
`request-id`) are the HTTP layer's (http/anthropic.py); these handlers are the route's.
"""

from __future__ import annotations

from dataclasses import replace

from starlette.responses import JSONResponse, Response

from ..generated import v1
from ..serving.messages.request import message_ask
from .common import admitted, parse, request_body, state, typed_response, unless_disconnected


async def create_message() -> Response:
    """POST /v1/messages."""
    body = request_body()
    req = parse(v1.CreateMessageRequest, body)
    admission = admitted("messages", req.model, body)
    ask = message_ask(req)
    admission = replace(admission, ignored=(*admission.ignored, *ask.unused))
    return typed_response(await unless_disconnected(state().messages.serve(ask, admission)))


async def count_message_tokens() -> Response:
    """POST /v1/messages/count_tokens."""
    body = request_body()
    req = parse(v1.CountMessageTokensRequest, body)
    admission = admitted("messages", req.model, body)
    ask = message_ask(req)
    admission = replace(admission, ignored=(*admission.ignored, *ask.unused))
    reply = await state().messages.count(ask, admission)
    return JSONResponse(reply.body, headers=reply.headers)
