"""Handlers of the `models` tag."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..models.manager import listed
from .common import state


async def list_models() -> JSONResponse:
    """GET /v1/models."""
    return JSONResponse({"object": "list", "data": listed(state().manager.registry.entries())})


async def retrieve_model(model_id: str) -> JSONResponse:
    """GET /v1/models/{model_id}."""
    entry = state().manager.entry(model_id)
    return JSONResponse(listed([entry])[0])
