"""Handlers of the `circuits` tag (/api/circuits)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..steering.circuit_admin import CircuitAdmin
from .common import parse_local, request_body, state


def _admin() -> CircuitAdmin:
    return state().circuits


async def list_circuits() -> JSONResponse:
    """GET /api/circuits."""
    return JSONResponse(_admin().circuits())


async def import_circuit() -> JSONResponse:
    """POST /api/circuits: a `mi.circuit/v1` document."""
    view, created = _admin().import_circuit(request_body())
    return JSONResponse(view, status_code=201 if created else 200)


async def active_circuits() -> JSONResponse:
    """GET /api/circuits/active."""
    return JSONResponse(_admin().active())


async def get_circuit(id: str) -> JSONResponse:
    """GET /api/circuits/{id}."""
    return JSONResponse(_admin().circuit(id))


async def delete_circuit(id: str) -> JSONResponse:
    """DELETE /api/circuits/{id}."""
    return JSONResponse(_admin().delete(id))


async def set_circuit_dial(id: str) -> JSONResponse:
    """PUT /api/circuits/{id}/dial: the persistent dial λ."""
    req = parse_local(api.DialRequest, request_body())
    return JSONResponse(_admin().set_dial(id, req.intensity))


async def activate_circuit(id: str) -> JSONResponse:
    """PUT /api/circuits/{id}/active."""
    return JSONResponse(_admin().set_active(id, True))


async def deactivate_circuit(id: str) -> JSONResponse:
    """DELETE /api/circuits/{id}/active."""
    return JSONResponse(_admin().set_active(id, False))
