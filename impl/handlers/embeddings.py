"""Handlers of the `embeddings` tag."""

from __future__ import annotations

from typing import Any

from connexion.context import request
from starlette.responses import JSONResponse

from ..generated import v1
from .common import parse, state


async def create_embeddings(body: dict[str, Any]) -> JSONResponse:
    """POST /v1/embeddings."""
    req = parse(v1.EmbeddingRequest, body)
    reply = await state().embeddings.serve(req, body, request.headers)
    return JSONResponse(reply.body, headers=reply.headers)
