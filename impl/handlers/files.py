"""Handlers of the `files` tag (OpenAI's Files API, contract 0.30.0)."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse, Response

from ..errors import InvalidParameter
from .common import state


async def upload_file(
    body: dict[str, Any] | None = None, file: UploadFile | None = None
) -> Response:
    """POST /v1/files: multipart/form-data (`file`, `purpose`: Connexion hands the file part
    as `file`, the others in `body`), or JSON (`purpose`, `filename`, `content`)."""
    fields = body or {}
    purpose = fields.get("purpose")
    if not isinstance(purpose, str):
        raise InvalidParameter("purpose", "The upload needs a `purpose`.")
    if file is None:  # the JSON upload (its schema required the three fields)
        content = str(fields.get("content", "")).encode("utf-8")
        stored = state().files.upload(str(fields.get("filename", "")), purpose, content)
    else:
        try:
            content = await file.read()
        finally:
            await file.close()
        stored = state().files.upload(file.filename or "upload.jsonl", purpose, content)
    return JSONResponse(stored.view())


def list_files(
    purpose: str | None = None, limit: int = 10000, order: str = "desc", after: str | None = None
) -> Response:
    """GET /v1/files."""
    return JSONResponse(state().files.listed(purpose, limit=limit, order=order, after=after))


def retrieve_file(file_id: str) -> Response:
    """GET /v1/files/{file_id}."""
    return JSONResponse(state().files.found(file_id).view())


def delete_file(file_id: str) -> Response:
    """DELETE /v1/files/{file_id}."""
    return JSONResponse(state().files.delete(file_id))


def file_content(file_id: str) -> Response:
    """GET /v1/files/{file_id}/content: the bytes as kept."""
    return Response(state().files.content(file_id), media_type="application/octet-stream")
