"""Handlers of the `tokenizer` tag: vLLM's tokenizer endpoints, under /v1 and at the root
(http/aliases.py)."""

from __future__ import annotations

from connexion.context import request
from starlette.responses import JSONResponse

from ..generated import v1
from .common import parse, request_body, state


async def tokenize() -> JSONResponse:
    """POST /v1/tokenize (and /tokenize)."""
    body = request_body()
    req = parse(v1.TokenizeRequest, body)
    reply = await state().tokenizer.tokenize(req, body, request.headers)
    return JSONResponse(reply.body, headers=reply.headers)


async def detokenize() -> JSONResponse:
    """POST /v1/detokenize (and /detokenize)."""
    body = request_body()
    req = parse(v1.DetokenizeRequest, body)
    reply = await state().tokenizer.detokenize(req, body, request.headers)
    return JSONResponse(reply.body, headers=reply.headers)


async def tokenizer_info(model: str | None = None) -> JSONResponse:
    """GET /v1/tokenizer_info (and /tokenizer_info)."""
    reply = await state().tokenizer.info(model)
    return JSONResponse(reply.body, headers=reply.headers)
