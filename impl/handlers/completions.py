"""Handlers of the `completions` tag."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..generated import v1
from ..serving.requests import completion_request
from .common import parse, respond, service


async def create_completion(body: dict[str, Any]) -> Response:
    """POST /v1/completions."""
    req = parse(v1.CompletionRequest, body)
    return await respond(service().serve, completion_request(req), body)
