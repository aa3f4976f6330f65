"""Handlers of the `chat` tag."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..generated import v1
from ..serving.requests import chat_request
from .common import parse, respond, service


async def create_chat_completion(body: dict[str, Any]) -> Response:
    """POST /v1/chat/completions."""
    req = parse(v1.ChatCompletionRequest, body)
    return await respond(service().serve, chat_request(req), body)
