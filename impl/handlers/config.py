"""Handlers of the `config` tag (/api): the parameter table and the config."""

from __future__ import annotations

from connexion.context import request
from starlette.responses import JSONResponse

from ..generated import api
from ..models.locator import is_loopback_peer
from .common import parse_local, request_body, state


async def params() -> JSONResponse:
    """GET /api/params (LOC-PARAMS-01)."""
    return JSONResponse(state().config.params())


async def get_config() -> JSONResponse:
    """GET /api/config (LOC-CONFIG-01)."""
    return JSONResponse(state().config.view())


async def put_config() -> JSONResponse:
    """PUT /api/config (LOC-CONFIG-10): refusals per key come back in `rejected`."""
    req = parse_local(api.ConfigUpdate, request_body())
    local = is_loopback_peer(request.scope)
    change = state().config.update(req.values, req.reset or (), req.auto_plan, peer_local=local)
    return JSONResponse(change)
