"""Handlers of the `health` tag (/api): how inference is served now."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..local.health import inference
from .common import state


async def inference_health() -> JSONResponse:
    """GET /api/health/inference (OAI-CBM-14)."""
    server = state()
    return JSONResponse(inference(server.manager, server.scheduler))
