"""Handlers of the `batches` tag (OpenAI's Batch API, contract 0.31.0)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ..generated import v1
from .common import parse, request_body, state


def create_batch() -> Response:
    """POST /v1/batches."""
    body = request_body()
    req = parse(v1.CreateBatchRequest, body)
    metadata = body.get("metadata")  # as sent: the typed map wraps each value
    made = state().batches.create(req.input_file_id, req.endpoint, req.completion_window, metadata)
    return JSONResponse(made)


def list_batches(limit: int = 20, after: str | None = None) -> Response:
    """GET /v1/batches."""
    return JSONResponse(state().batches.listed(limit=limit, after=after))


def retrieve_batch(batch_id: str) -> Response:
    """GET /v1/batches/{batch_id}."""
    return JSONResponse(state().batches.found(batch_id))


def cancel_batch(batch_id: str) -> Response:
    """POST /v1/batches/{batch_id}/cancel."""
    return JSONResponse(state().batches.cancel(batch_id))
