"""Handlers of the `decide` tag (/api/decide)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from .common import parse_local, request_body, state


async def decide() -> JSONResponse:
    """POST /api/decide."""
    req = parse_local(api.DecideRequest, request_body())
    reuse = True if req.reuse_prefix is None else req.reuse_prefix
    server = state()
    answer = await server.decisions.decide(req.prefix, req.suffix, req.choices, reuse)
    server.bus.publish("decide", answer)  # LOC-EVENTS-17
    return JSONResponse(answer)
