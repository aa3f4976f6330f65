"""Handlers of the `chat` tag."""

from __future__ import annotations

from starlette.responses import Response

from ..generated import v1
from ..serving.completions.requests import chat_request
from .common import parse, request_body, respond


async def create_chat_completion() -> Response:
    """POST /v1/chat/completions."""
    body = request_body()
    req = parse(v1.ChatCompletionRequest, body)
    return await respond(chat_request(req), body)
