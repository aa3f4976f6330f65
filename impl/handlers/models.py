"""Handlers of the `models` tag."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..errors import ApiError
from ..models.manager import listed
from .common import state


async def list_models() -> JSONResponse:
    """GET /v1/models."""
    return JSONResponse(
        {"object": "list", "data": listed(state().manager, state().manager.registry.entries())}
    )


async def retrieve_model(model_id: str) -> JSONResponse:
    """GET /v1/models/{model_id}."""
    manager = state().manager
    entry = manager.entry(model_id)
    manager.check_lock(entry)
    shown = listed(manager, [entry])
    if not shown:
        raise ApiError("model_not_found", f"The model `{model_id}` is not available.", "model")
    return JSONResponse(shown[0])
