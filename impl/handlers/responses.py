"""Handlers of the `responses` tag (OpenAI's Responses API, contract 0.20.0)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ..errors import ApiError
from ..generated import v1
from ..serving.paging import page
from ..store.responses import ResponseNotFound, StoredResponse
from .common import admitted, parse, request_body, state, typed_response, unless_disconnected


async def create_response() -> Response:
    """POST /v1/responses."""
    body = request_body()
    req = parse(v1.CreateResponseRequest, body)
    admission = admitted("responses", req.model, body)
    service = state().responses
    ask = await service.ask(req)
    admission = admission.reporting(ask.unused)
    return typed_response(await unless_disconnected(service.serve(ask, admission)))


def retrieve_response(response_id: str, include: list[str] | None = None) -> Response:
    """GET /v1/responses/{response_id}."""
    return JSONResponse(_stored(response_id).response)


def delete_response(response_id: str) -> Response:
    """DELETE /v1/responses/{response_id}."""
    try:
        state().responses.store.delete(response_id)
    except ResponseNotFound:
        raise _not_found(response_id) from None
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def list_input_items(
    response_id: str,
    limit: int = 20,
    order: str = "desc",
    after: str | None = None,
    include: list[str] | None = None,
) -> Response:
    """GET /v1/responses/{response_id}/input_items."""
    stored = _stored(response_id)
    return JSONResponse(page(list(stored.input_items), limit=limit, order=order, after=after))


def cancel_response(response_id: str) -> Response:
    """POST /v1/responses/{response_id}/cancel: no response runs in the background here."""
    _stored(response_id)
    raise ApiError(
        "invalid_request",
        f"Response `{response_id}` did not run in the background (this server runs none "
        "there: `background: true` is refused), so it cannot be cancelled.",
        "response_id",
    )


def _stored(response_id: str) -> StoredResponse:
    try:
        return state().responses.store.get(response_id)
    except ResponseNotFound:
        raise _not_found(response_id) from None


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        "response_not_found", f"No stored response has the id `{response_id}`.", "response_id"
    )
