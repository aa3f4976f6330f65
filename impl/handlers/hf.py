"""Handlers of the `hf` tag (/api/hf): search, list, add, forget."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..models.hf_admin import HfAdmin
from ..models.inspection import Machine
from .common import parse_local, request_body, state


def _admin() -> HfAdmin:
    return state().hf


async def hf_search() -> JSONResponse:
    """POST /api/hf/search."""
    req = parse_local(api.HfSearchRequest, request_body())
    return JSONResponse(await _admin().search(req.query, req.token))


async def hf_models() -> JSONResponse:
    """POST /api/hf/models."""
    req = parse_local(api.HfModelsRequest, request_body())
    return JSONResponse(await _admin().models(req.repo, req.token))


async def hf_add() -> JSONResponse:
    """POST /api/hf/add: 201, also when it replaces an earlier addition."""
    req = parse_local(api.HfAddRequest, request_body())
    return JSONResponse(await _admin().add(req.repo, req.name, req.token), status_code=201)


async def hf_inspect() -> JSONResponse:
    """POST /api/hf/inspect: the header by range requests, set against this machine."""
    req = parse_local(api.HfInspectRequest, request_body())
    server = state()
    resident = server.manager.resident
    machine = Machine(
        server.downloads.models_dir,
        "" if resident is None else resident.entry.model_id,
        server.planner.loaded_held(),
    )
    return JSONResponse(await _admin().inspect(req.repo, req.name, req.token, machine))


async def hf_forget(id: str) -> JSONResponse:
    """DELETE /api/hf/entry/{id}."""
    _admin().forget(id)
    return JSONResponse({"ok": True})
