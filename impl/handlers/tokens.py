"""Handlers of the `tokens` tag (/api/detokenize)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..serving.tokens import pieces
from .common import parse_local, request_body, state


async def detokenize() -> JSONResponse:
    """POST /api/detokenize."""
    req = parse_local(api.DetokenizeRequest, request_body())
    ids = [token.root for token in req.tokens]
    return JSONResponse(await pieces(state().manager, ids))
