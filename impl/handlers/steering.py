"""Handlers of the `saes` and `steering` tags (/api)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..steering.admin import SteeringAdmin
from .common import parse_local, request_body, state


def _admin() -> SteeringAdmin:
    return state().admin


async def list_saes() -> JSONResponse:
    """GET /api/saes."""
    return JSONResponse(_admin().saes())


async def get_steering() -> JSONResponse:
    """GET /api/steering."""
    return JSONResponse(_admin().state())


async def attach_sae() -> JSONResponse:
    """POST /api/steering/attachments."""
    req = parse_local(api.AttachRequest, request_body())
    view, created = _admin().attach(req.sae_id, req.layer)
    return JSONResponse(view, status_code=201 if created else 200)


async def detach_sae(sae_id: str, layer: int, model: str | None = None) -> JSONResponse:
    """DELETE /api/steering/attachments/{sae_id}/{layer}."""
    return JSONResponse(_admin().detach(sae_id, layer, model))


async def set_live_values(sae_id: str, layer: int, model: str | None = None) -> JSONResponse:
    """PUT /api/steering/attachments/{sae_id}/{layer}/features."""
    req = parse_local(api.LiveValues, request_body())
    features = [(f.index, f.strength) for f in req.features]
    return JSONResponse(_admin().set_values(sae_id, layer, model, features))


async def clear_live_values(sae_id: str, layer: int, model: str | None = None) -> JSONResponse:
    """DELETE /api/steering/attachments/{sae_id}/{layer}/features."""
    return JSONResponse(_admin().set_values(sae_id, layer, model, []))


def _lock_view() -> dict[str, object]:
    lock = state().manager.lock
    model = None if lock is None else lock.model
    return {"locked": model is not None, "model": model}


async def get_lock() -> JSONResponse:
    """GET /api/steering/lock."""
    return JSONResponse(_lock_view())


async def put_lock() -> JSONResponse:
    """PUT /api/steering/lock: lock the server to one model (OAI-MODELS-05)."""
    req = parse_local(api.LockRequest, request_body())
    manager = state().manager
    entry = manager.entry(req.model)  # 404 or 400 AMBIGUOUS_MODEL_NAME before anything
    if manager.lock is not None:
        manager.lock.set(entry.model_id)
    return JSONResponse(_lock_view())


async def delete_lock() -> JSONResponse:
    """DELETE /api/steering/lock: lift the lock (no lock: nothing changes)."""
    lock = state().manager.lock
    if lock is not None:
        lock.set(None)
    return JSONResponse(_lock_view())


async def get_active_profile() -> JSONResponse:
    """GET /api/steering/active-profile."""
    return JSONResponse(_admin().active())


async def set_active_profile() -> JSONResponse:
    """PUT /api/steering/active-profile."""
    req = parse_local(api.ActiveProfileRequest, request_body())
    return JSONResponse(_admin().activate(req.name))
