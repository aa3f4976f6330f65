"""Handlers of the `probes` tag (/api/probes)."""

from __future__ import annotations

from connexion.context import request
from starlette.responses import JSONResponse

from ..generated import api
from ..models.locator import is_loopback_peer
from ..probes.admin import ProbeAdmin
from .common import parse_local, request_body, state


def _admin() -> ProbeAdmin:
    return state().probes


async def list_probes() -> JSONResponse:
    """GET /api/probes."""
    return JSONResponse(_admin().listing())


async def get_probe(name: str) -> JSONResponse:
    """GET /api/probes/{name}."""
    return JSONResponse(_admin().get(name))


async def put_probe(name: str) -> JSONResponse:
    """PUT /api/probes/{name}: define or replace."""
    body = request_body()
    parse_local(api.ProbeInput, body)  # the schema's refusals name the field
    view, created = _admin().put(name, body)
    return JSONResponse(view, status_code=201 if created else 200)


async def import_probe() -> JSONResponse:
    """POST /api/probes/import: a `mi.probe/v1` sidecar on this machine."""
    req = parse_local(api.ProbeImport, request_body())
    local = is_loopback_peer(request.scope)  # a network peer reads only the model folders
    state().session.locator.check_file(req.path, peer_local=local, param="path")
    view, created = _admin().import_file(req.path, req.armed)
    return JSONResponse(view, status_code=201 if created else 200)


async def delete_probe(name: str) -> JSONResponse:
    """DELETE /api/probes/{name}."""
    return JSONResponse(_admin().delete(name))


async def arm_probe(name: str) -> JSONResponse:
    """POST /api/probes/{name}/arm."""
    return JSONResponse(_admin().arm(name, True))


async def disarm_probe(name: str) -> JSONResponse:
    """POST /api/probes/{name}/disarm."""
    return JSONResponse(_admin().arm(name, False))


async def probe_events(
    after: int = 0, limit: int = 100, probe: str | None = None, request_id: str | None = None
) -> JSONResponse:
    """GET /api/probes/events."""
    return JSONResponse(_admin().events(after, limit, probe, request_id))


async def score_probes() -> JSONResponse:
    """POST /api/probes/score: no generation, so no X-miLLM-Steering (OAI-HDR-19)."""
    req = parse_local(api.ProbeScoreRequest, request_body())
    messages = None if req.messages is None else [dict(m) for m in req.messages]
    scored = await state().probe_scores.score(
        model=req.model, text=req.input, messages=messages, names=req.probes
    )
    return JSONResponse(scored)
