"""Handlers of the `contract` tag: the OpenAPI documents and the published schemas."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from .. import contract
from ..errors import ApiError


async def openapi_v1() -> JSONResponse:
    """GET /v1/openapi.json: spec/openapi/v1.yaml as JSON."""
    return JSONResponse(contract.document("v1"))


async def openapi_api() -> JSONResponse:
    """GET /api/openapi.json: spec/openapi/api.yaml as JSON."""
    return JSONResponse(contract.document("api"))


async def published_schema(name: str) -> Response:
    """GET /api/schemas/{name}: the file in spec/schemas, byte for byte."""
    try:
        return Response(contract.schema_bytes(name), media_type="application/json")
    except KeyError:
        raise ApiError("not_found", f"No published schema is named {name!r}.", "name") from None
