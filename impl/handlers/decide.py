"""Handlers of the `decide` tag (/api/decide)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from ..generated import api
from .common import parse_local, state


async def decide(body: dict[str, Any]) -> JSONResponse:
    """POST /api/decide."""
    req = parse_local(api.DecideRequest, body)
    reuse = True if req.reuse_prefix is None else req.reuse_prefix
    server = state()
    answer = await server.decider.decide(req.prefix, req.suffix, req.choices, reuse)
    server.bus.publish("decide", answer)  # LOC-EVENTS-17
    return JSONResponse(answer)
