"""Handlers of the `embeddings` tag."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import v1
from .common import admitted, parse, request_body, state


async def create_embeddings() -> JSONResponse:
    """POST /v1/embeddings."""
    body = request_body()
    req = parse(v1.EmbeddingRequest, body)
    reply = await state().embeddings.serve(req, admitted("embeddings", req.model, body))
    return JSONResponse(reply.body, headers=reply.headers)
