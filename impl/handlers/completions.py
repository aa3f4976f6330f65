"""Handlers of the `completions` tag."""

from __future__ import annotations

from starlette.responses import Response

from ..generated import v1
from ..serving.completions.requests import completion_request
from .common import parse, request_body, respond


async def create_completion() -> Response:
    """POST /v1/completions."""
    body = request_body()
    req = parse(v1.CompletionRequest, body)
    return await respond(completion_request(req), body)
