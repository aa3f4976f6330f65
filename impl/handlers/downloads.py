"""Handlers of the catalog downloads (/api/models/download, /api/models/partial)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ..generated import api
from ..models.downloads import Downloads
from .common import parse_local, request_body, state


def _downloads() -> Downloads:
    return state().downloads


async def start_download() -> JSONResponse:
    """POST /api/models/download: 202, also when it was already running (a no-op)."""
    req = parse_local(api.DownloadRequest, request_body())
    _downloads().start(req.id)
    return JSONResponse({"id": req.id, "state": "running"}, status_code=202)


async def cancel_download(id: str) -> JSONResponse:
    """DELETE /api/models/download/{id}: the `.part` files stay."""
    await _downloads().cancel(id)
    return JSONResponse({"ok": True})


async def delete_partial(id: str) -> JSONResponse:
    """DELETE /api/models/partial/{id}."""
    return JSONResponse({"ok": True, "freed": _downloads().delete_partial(id)})
