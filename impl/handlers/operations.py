"""Handlers of the `operations` tag (/v1, and at the root): metrics and health probes."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ..errors import ApiError
from ..local.health import readiness as ready_now
from ..metrics import CONTENT_TYPE
from .common import state


async def metrics() -> Response:
    """GET /v1/metrics (and /metrics): Prometheus's text format; 404 while they are off."""
    metrics = state().metrics
    if not metrics.on:
        raise ApiError("not_found", "Metrics are off: this server was started with --no-metrics.")
    return Response(metrics.exposition(), media_type=CONTENT_TYPE)


async def liveness() -> JSONResponse:
    """GET /v1/health (and /health): the process serves."""
    return JSONResponse({"status": "alive"})


async def readiness() -> JSONResponse:
    """GET /v1/health/ready (and /health/ready): 200 while a model serves, else 503."""
    status, body = ready_now(state().manager)
    return JSONResponse(body, status_code=status)
