"""What every handler shares: the server state and turning results into responses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from connexion.context import request
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import ApiError
from ..http.body import location, parsed
from ..http.sse import frames, typed_frames
from ..probes.trace import HEADER as TRACE_HEADER
from ..probes.trace import trace_id
from ..serving.admission import Admission, admit
from ..serving.completions.requests import GenerationRequest
from ..serving.completions.service import CompletionService
from ..serving.results import Reply, StreamReply, TypedStreamReply

if TYPE_CHECKING:
    from ..app import ServerState

DISCONNECT_POLL_SECONDS = 0.25
CLIENT_CLOSED = 499  # nobody reads it: the client is gone


M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")  # what a request's work answers (a reply, or a stream of one kind)
S = TypeVar("S", StreamReply, TypedStreamReply)  # a stream reply of one kind


def parse(model: type[M], body: Mapping[str, Any], code: str = "invalid_parameter") -> M:
    """The generated model of a body the spec already validated (a mismatch is still a 400)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = location(_body_path(body, first["loc"])) or "body"
        raise ApiError(code, f"Invalid value for `{param}`: {first['msg']}.", param) from exc


def parse_local(model: type[M], body: Mapping[str, Any]) -> M:
    """`parse` for an /api body: a mismatch is 400 invalid_request (LOC-GEN-16)."""
    return parse(model, body, "invalid_request")


def _body_path(body: Any, loc: Sequence[Any]) -> Iterator[str | int]:
    """The parts of a pydantic `loc` that step into the body (union member tags dropped)."""
    value = body
    for part in loc:
        if _holds(value, part):
            value = value[part]
            yield part
        elif value is body and isinstance(part, str):
            yield part  # a missing top-level field: name it
            return


def _holds(value: Any, part: Any) -> bool:
    if isinstance(value, Mapping):
        return isinstance(part, str) and part in value
    return isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)


def request_body() -> Any:
    """The JSON body, parsed once at the entry (http/body.py); None when the request had none."""
    return parsed(request.scope)


def state() -> ServerState:
    """The state of the server this request reached."""
    found: ServerState = request.scope["miserver"]
    return found


def service() -> CompletionService:
    return state().completions


async def unless_disconnected(work: Awaitable[R]) -> R | None:
    """Run `work`; if the client leaves first, cancel it (generation stops at the next token).
    The client is looked at each `DISCONNECT_POLL_SECONDS` the work runs on: work done
    sooner (a stream's start, on a resident model) pays for no watcher."""
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS))[0]:
            if await request.is_disconnected():
                break
    except BaseException:  # this request was cancelled itself: its work goes with it
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def admitted(endpoint: str, model_id: str, body: Mapping[str, Any]) -> Admission:
    """The request let in to `endpoint` (serving/admission.py), or its refusal; with the W3C
    trace its `traceparent` joins (a fresh one when it sends none)."""
    admission = admit(state().manager, endpoint, model_id, body, request_headers=request.headers)
    sent = tuple(request.headers.getlist(TRACE_HEADER))
    return replace(admission, trace_id=trace_id(sent), traceparent=sent)


async def respond(req: GenerationRequest, body: Mapping[str, Any]) -> Response:
    """A completion's JSON reply, or its SSE stream; errors propagate to the error handlers."""
    admission = admitted(req.endpoint, req.model_id, body)
    result = await unless_disconnected(service().serve(req, admission))
    return _answer(result, lambda stream: frames(stream.events))


def typed_response(result: Reply | TypedStreamReply | None) -> Response:
    """A front end's reply (the Responses and Messages APIs): its JSON, or its typed SSE
    events; the client gone, 499."""
    return _answer(result, lambda stream: typed_frames(stream.events))


def _answer(result: Reply | S | None, encode: Callable[[S], AsyncIterator[bytes]]) -> Response:
    """The JSON of a reply, or a stream's events as SSE (`encode`); the client gone, 499."""
    if result is None:
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(result, Reply):
        return JSONResponse(result.body, headers=result.headers)
    headers = {**result.headers, "Cache-Control": "no-cache"}
    return StreamingResponse(encode(result), media_type="text/event-stream", headers=headers)
