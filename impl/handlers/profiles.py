"""Handlers of the `profiles` tag (/api/profiles)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..steering.admin import SteeringAdmin
from .common import parse_local, request_body, state


def _admin() -> SteeringAdmin:
    return state().admin


async def list_profiles() -> JSONResponse:
    """GET /api/profiles."""
    return JSONResponse(_admin().profiles())


async def get_profile(name: str) -> JSONResponse:
    """GET /api/profiles/{name}."""
    return JSONResponse(_admin().profile(name))


async def put_profile(name: str) -> JSONResponse:
    """PUT /api/profiles/{name}: create or replace."""
    req = parse_local(api.ProfileInput, request_body())
    bounds = None if req.intensity_range is None else [r.root for r in req.intensity_range]
    view, created = _admin().put_profile(
        name,
        sae_id=req.sae_id,
        layer=req.layer,
        features=[(f.index, f.strength) for f in req.features],
        description=req.description,
        intensity=req.intensity,
        intensity_range=bounds,
    )
    return JSONResponse(view, status_code=201 if created else 200)


async def delete_profile(name: str) -> JSONResponse:
    """DELETE /api/profiles/{name}."""
    return JSONResponse(_admin().delete_profile(name))


async def import_cluster() -> JSONResponse:
    """POST /api/clusters: a `mi.cluster/v1` document, stored as a profile."""
    view, created = _admin().import_cluster(request_body())
    return JSONResponse(view, status_code=201 if created else 200)


async def set_dial(name: str) -> JSONResponse:
    """PUT /api/profiles/{name}/dial: the persistent dial λ."""
    req = parse_local(api.DialRequest, request_body())
    return JSONResponse(_admin().set_dial(name, req.intensity))
