"""Handlers of the `session` tag (/api)."""

from __future__ import annotations

from importlib import resources

from starlette.responses import JSONResponse, Response

from .common import state


async def cancel() -> JSONResponse:
    """POST /api/cancel: always 200."""
    return JSONResponse({"cancelled": state().scheduler.cancel_holder()})


async def published_schema(name: str) -> Response:
    """GET /api/schemas/{name}: the file in spec/schemas, byte for byte."""
    text = (resources.files("miserver.spec") / "schemas" / name).read_bytes()
    return Response(text, media_type="application/json")
