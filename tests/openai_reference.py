"""OpenAI's own response schemas as a check on every body a client receives.

`../shared/reference/openai-response-schemas.json` holds the response schemas of
OpenAI's published API specification, rewritten to JSON Schema Draft 2020-12.
`schema_name` picks the schema a body answers to from its route, status and
whether it is a stream event; `violations` checks one body against it; the
transports below wrap httpx's, so that every response an SDK or LangChain client
receives is checked, each `data:` event of a stream included, and the first
invalid body raises `SchemaViolation` with the JSON path of the problem. A
`Check` also keeps every problem, so a fixture can fail the test even where a
client library catches the exception.

The schemas declare no `additionalProperties: false`, so our extension members
(`millm_*`, a model's `state`) pass as extras: nothing is stripped and the
schemas are used as published, with three narrow adaptations that OpenAI's own
API needs too:

- an embedding sent as base64 (`encoding_format: "base64"`, which the SDK asks
  for by default) is decoded to its little-endian float32 values before the
  check, as the document's `$comment` says; a string that does not decode is
  left as it is and fails `Embedding.embedding`;
- a streamed text completion chunk may carry `finish_reason: null` and
  `usage: null`: the schema is shared by both shapes and lists only final
  values, while OpenAI sends null until the last chunk (its `stream_options`
  documents "All other chunks will also include a usage field, but with a null
  value"), as the chat chunk's schema allows;
- a text completion's `logprobs` may start with `null` in `token_logprobs`
  and `top_logprobs`, for an echoed prompt's first token (`echo`), which
  nothing predicts: OpenAI's legacy API answers so, while its schema types
  the items as numbers and maps (docs/DECISIONS.md, contract 0.17.0).
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import importlib
import json
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import openai
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

if TYPE_CHECKING:
    import httpx2 as http
else:
    http = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    """The HTTP library the installed SDK is built on: `httpx2` from openai 3 on (its API
    mirrors httpx's), `httpx` before; clients of the other one would only work by luck."""

REFERENCE: Final = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
SCHEMAS: Final = REFERENCE / "openai-response-schemas.json"
RESPONSES_SCHEMAS: Final = REFERENCE / "openai-responses-schemas.json"
RESPONSES: Final = "responses:"
"""The prefix of a schema name in the Responses API's document (`responses:Response`)."""
COMPLETION_CHUNK: Final = "CreateCompletionResponse (stream chunk)"
"""A streamed text completion: `CreateCompletionResponse` whose `finish_reason` and `usage`
may be null."""

ROUTES: Final = {
    "/chat/completions": ("CreateChatCompletionResponse", "CreateChatCompletionStreamResponse"),
    "/completions": ("CreateCompletionResponse", COMPLETION_CHUNK),
    "/embeddings": ("CreateEmbeddingResponse", None),
    "/models": ("ListModelsResponse", None),
    "/responses": (RESPONSES + "Response", RESPONSES + "ResponseStreamEvent"),
}
"""Route under `/v1` → (schema of its JSON body, schema of each of its stream events)."""

STORED: Final = {
    ("GET", ""): RESPONSES + "Response",
    ("GET", "/input_items"): RESPONSES + "ResponseItemList",
}
"""(method, what follows `/responses/{id}`) → the schema of the body; a DELETE's body
(`{id, object, deleted}`) has none in OpenAI's document."""

ENDINGS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The events a Responses stream ends with (it has no `[DONE]`)."""


class SchemaViolation(AssertionError):
    """A body the server sent does not validate against OpenAI's schema for it."""


@functools.cache
def document() -> dict[str, Any]:
    """The reference document, with the stream-chunk variant of a text completion added."""
    loaded: dict[str, Any] = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    chunk = copy.deepcopy(loaded["$defs"]["CreateCompletionResponse"])
    choice = chunk["properties"]["choices"]["items"]["properties"]
    choice["finish_reason"] = {"anyOf": [choice["finish_reason"], {"type": "null"}]}
    chunk["properties"]["usage"] = {"anyOf": [chunk["properties"]["usage"], {"type": "null"}]}
    loaded["$defs"][COMPLETION_CHUNK] = chunk
    return loaded


@functools.cache
def responses_document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(RESPONSES_SCHEMAS.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def validator(name: str) -> Draft202012Validator:
    """A validator for `#/$defs/<name>` with the whole document as its root (the Responses
    API's document for a `responses:` name)."""
    root, source = document(), SCHEMAS
    if name.startswith(RESPONSES):
        root, source, name = responses_document(), RESPONSES_SCHEMAS, name[len(RESPONSES) :]
    if name not in root["$defs"]:
        raise KeyError(f"no schema {name!r} in {source.name}")
    pointer = "#/$defs/" + name.replace("~", "~0").replace("/", "~1")
    return Draft202012Validator({**root, "$ref": pointer})


def route(path: str) -> str | None:
    """The part of a URL path after `/v1`, or None outside the OpenAI API."""
    return path[3:].rstrip("/") if path.startswith("/v1/") else None


def schema_name(
    path: str, status: int, *, event: dict[str, Any] | None = None, method: str = "POST"
) -> str | None:
    """The schema a `/v1` body answers to: an error for any 4xx/5xx and any stream event
    holding `error`, else the route's body or stream-event schema; None where OpenAI has
    no such route (its body is not checked)."""
    tail = route(path)
    if tail is None:
        return None
    if status >= 400 or (event is not None and "error" in event):
        return "ErrorResponse"
    if tail.startswith("/models/"):
        return "Model" if event is None else None
    if tail.startswith("/responses/"):
        rest = tail.removeprefix("/responses/").partition("/")
        return STORED.get((method, rest[1] + rest[2])) if event is None else None
    body, stream = ROUTES.get(tail, (None, None))
    return body if event is None else stream


def decoded_embeddings(body: Any) -> Any:
    """`body` with each base64 embedding replaced by its float32 values, where it decodes."""
    items = body.get("data") if isinstance(body, dict) else None
    if not isinstance(items, list) or not any(
        isinstance(item, dict) and isinstance(item.get("embedding"), str) for item in items
    ):
        return body
    return {**body, "data": [_decoded(item) for item in items]}


def echoed_first(body: Any) -> Any:
    """`body` with each choice's first `token_logprobs` and `top_logprobs` entry, when both
    are null (an echoed prompt's first token, which nothing predicts), read as 0 and {}."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list):
        return body
    return {**body, "choices": [_first_filled(choice) for choice in choices]}


def _first_filled(choice: Any) -> Any:
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(logprobs, dict):
        return choice
    values, tops = logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if not (isinstance(values, list) and isinstance(tops, list) and values and tops):
        return choice
    if values[0] is not None or tops[0] is not None:
        return choice
    filled = {**logprobs, "token_logprobs": [0.0, *values[1:]], "top_logprobs": [{}, *tops[1:]]}
    return {**choice, "logprobs": filled}


def _decoded(item: Any) -> Any:
    if not isinstance(item, dict) or not isinstance(item.get("embedding"), str):
        return item
    try:
        raw = base64.b64decode(item["embedding"], validate=True)
    except (binascii.Error, ValueError):
        return item
    if len(raw) % 4:
        return item
    return {**item, "embedding": list(struct.unpack(f"<{len(raw) // 4}f", raw))}


def violations(name: str, body: Any) -> list[str]:
    """Each way `body` fails `#/$defs/<name>`, most relevant first, as `<json path>: <why>`."""
    checked = decoded_embeddings(body) if name == "CreateEmbeddingResponse" else body
    if name in ("CreateCompletionResponse", COMPLETION_CHUNK):
        checked = echoed_first(checked)
    errors = list(validator(name).iter_errors(checked))
    if not errors:
        return []
    first = best_match(errors)
    rest = [e for e in errors if e is not first]
    return [f"{e.json_path}: {e.message}" for e in (first, *rest)]


@dataclass(frozen=True, slots=True)
class Received:
    """One body a client received: a whole response, or one event of a stream."""

    method: str
    path: str
    status: int
    schema: str | None
    body: Any
    event: bool


@dataclass(slots=True)
class Check:
    """Validates the bodies it is given, keeps them, and keeps every problem found."""

    received: list[Received] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def body(self, request: http.Request, status: int, text: str, *, event: bool) -> None:
        """Check one JSON text; raise SchemaViolation on the first problem."""
        path = request.url.path
        where = f"{request.method} {path} -> {status}{' (stream event)' if event else ''}"
        try:
            body = json.loads(text)
        except ValueError as exc:
            self._fail(f"{where}: not JSON ({exc}): {text[:200]!r}")
            return
        if event:
            name = schema_name(path, status, event=body if isinstance(body, dict) else {})
        else:
            name = schema_name(path, status, method=request.method)
        with self._lock:
            self.received.append(Received(request.method, path, status, name, body, event))
        if name is None:
            return
        found = violations(name, body)
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            self._fail(f"{where} fails OpenAI's {name} at {found[0]}{more}")

    def problem(self, request: http.Request, status: int, what: str) -> None:
        """Record a problem that is not a body's (e.g. a stream with no `[DONE]`)."""
        self._fail(f"{request.method} {request.url.path} -> {status}: {what}")

    def _fail(self, message: str) -> None:
        with self._lock:
            self.problems.append(message)
        raise SchemaViolation(message)


class _Reader:
    """Follows a response's bytes as the client reads them and checks each complete body."""

    def __init__(self, check: Check, request: http.Request, response: http.Response) -> None:
        self.check = check
        self.request = request
        self.status = response.status_code
        media = response.headers.get("content-type", "").split(";")[0].strip().lower()
        self.sse = media == "text/event-stream"
        self.json = media == "application/json" or media.endswith("+json")
        self.checked = route(request.url.path) is not None
        self.buffer = b""
        self.done = False
        self.typed = route(request.url.path) == "/responses"  # ends with its last event

    def feed(self, chunk: bytes) -> None:
        if not self.checked:
            return
        self.buffer += chunk
        if not self.sse:
            return
        self.buffer = self.buffer.replace(b"\r\n", b"\n")
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            self._event(block.decode("utf-8"))

    def end(self) -> None:
        """The body is complete: check it (or the stream's last event and its `[DONE]`)."""
        if not self.checked:
            return
        if self.sse:
            if self.buffer.strip():
                self._event(self.buffer.decode("utf-8"))
            if not self.done:
                missing = "its ending event" if self.typed else "[DONE]"
                self.check.problem(self.request, self.status, f"stream ended without {missing}")
        elif not self.json:
            self.check.problem(self.request, self.status, "a body that is neither JSON nor SSE")
        else:
            self.check.body(self.request, self.status, self.buffer.decode("utf-8"), event=False)

    def _event(self, block: str) -> None:
        lines = [line for line in block.split("\n") if line.startswith("data:")]
        if not lines:
            return  # a comment (`: keep-alive`) or an empty block
        text = "\n".join(line[5:].removeprefix(" ") for line in lines)
        if self.done:
            self.check.problem(self.request, self.status, f"an event after the end: {text[:200]}")
        elif text == "[DONE]" and not self.typed:
            self.done = True
        else:
            self.check.body(self.request, self.status, text, event=True)
            if self.typed:
                self._typed(block, text)

    def _typed(self, block: str, text: str) -> None:
        """A Responses event: its `event:` line names its `type`; an ending event ends it."""
        kind = json.loads(text).get("type")
        names = [line[6:].strip() for line in block.split("\n") if line.startswith("event:")]
        if names != [kind]:
            self.check.problem(self.request, self.status, f"event line {names} for a {kind!r}")
        self.done = kind in ENDINGS


class _CheckedStream(http.SyncByteStream):
    def __init__(self, inner: http.SyncByteStream, reader: _Reader) -> None:
        self.inner = inner
        self.reader = reader

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.reader.feed(chunk)
            yield chunk
        self.reader.end()

    def close(self) -> None:
        self.inner.close()


class _AsyncCheckedStream(http.AsyncByteStream):
    def __init__(self, inner: http.AsyncByteStream, reader: _Reader) -> None:
        self.inner = inner
        self.reader = reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.reader.feed(chunk)
            yield chunk
        self.reader.end()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _rewrapped(response: http.Response, stream: Any, request: http.Request) -> http.Response:
    return http.Response(
        response.status_code,
        headers=response.headers,
        stream=stream,
        extensions=response.extensions,
        request=request,
    )


class ValidatingTransport(http.BaseTransport):
    """httpx's transport, with every response body checked by `check` as it is read."""

    def __init__(self, check: Check, inner: http.BaseTransport | None = None) -> None:
        self.check = check
        self.inner = inner or http.HTTPTransport()

    def handle_request(self, request: http.Request) -> http.Response:
        response = self.inner.handle_request(request)
        assert isinstance(response.stream, http.SyncByteStream)
        reader = _Reader(self.check, request, response)
        return _rewrapped(response, _CheckedStream(response.stream, reader), request)

    def close(self) -> None:
        self.inner.close()


class AsyncValidatingTransport(http.AsyncBaseTransport):
    """The async twin of `ValidatingTransport`."""

    def __init__(self, check: Check, inner: http.AsyncBaseTransport | None = None) -> None:
        self.check = check
        self.inner = inner or http.AsyncHTTPTransport()

    async def handle_async_request(self, request: http.Request) -> http.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, http.AsyncByteStream)
        reader = _Reader(self.check, request, response)
        return _rewrapped(response, _AsyncCheckedStream(response.stream, reader), request)

    async def aclose(self) -> None:
        await self.inner.aclose()


TIMEOUT: Final = http.Timeout(600.0, connect=10.0)
"""Generous: a long generation on a 2-core machine shared with other test runs."""


def client(check: Check) -> http.Client:
    """An httpx client for an SDK (`http_client=`) whose every response `check` validates
    (no proxy from the environment: a mounted proxy transport would bypass the check)."""
    return http.Client(transport=ValidatingTransport(check), timeout=TIMEOUT, trust_env=False)


def async_client(check: Check) -> http.AsyncClient:
    return http.AsyncClient(
        transport=AsyncValidatingTransport(check), timeout=TIMEOUT, trust_env=False
    )
