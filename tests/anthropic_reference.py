"""Every body and stream event an Anthropic SDK receives from `/v1/messages*`, checked.

There is no published JSON Schema of Anthropic's API beside this checkout; its SDK's own
types are the reference: each JSON body is validated (pydantic validation, not the SDK's
lenient construction) as `Message`, `MessageTokensCount` or `ErrorResponse`, each stream
event as a `RawMessageStreamEvent` (or `ErrorResponse` for `error`), each one's `event:`
line naming its `type`, and the stream ending with `message_stop` or `error`. Each is also
checked against the contract's own schema of it (spec/openapi/v1.yaml), so the contract
and Anthropic's types agree. A problem raises in the client, and is kept in `problems`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import httpx2 as http
import pydantic
from anthropic import types as anthropic_types
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from miserver.contract import document as contract_document

PATHS = {"/v1/messages": "Message", "/v1/messages/count_tokens": "MessageTokensCount"}
EVENT = pydantic.TypeAdapter(anthropic_types.RawMessageStreamEvent)
ENDINGS = ("message_stop", "error")


class AnthropicViolation(AssertionError):
    """A body or an event that is not what Anthropic's API sends."""


@cache
def _contract(name: str) -> Draft202012Validator:
    """The contract's schema `name`, its `$ref`s resolved, nullable as JSON Schema says."""
    document = json.loads(json.dumps(contract_document("v1")))
    schemas = document["components"]["schemas"]

    def converted(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: converted(v) for k, v in node.items() if k != "nullable"}
            if "$ref" in out:
                out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/$defs/")
            if node.get("nullable") and "type" in out:
                out["type"] = [out["type"], "null"]
                if "enum" in out and None not in out["enum"]:
                    out["enum"] = [*out["enum"], None]
            return out
        if isinstance(node, list):
            return [converted(v) for v in node]
        return node

    return Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": converted(schemas)})


@dataclass(slots=True)
class AnthropicCheck:
    """Validates what a client receives; keeps the events of each stream, and problems."""

    streams: list[list[dict[str, Any]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def body(self, path: str, status: int, text: str) -> None:
        body = json.loads(text)
        if status >= 400:
            self._valid(anthropic_types.ErrorResponse, body, "AnthropicErrorResponse", path)
        elif path == "/v1/messages":
            self._valid(anthropic_types.Message, body, "Message", path)
        else:
            self._valid(anthropic_types.MessageTokensCount, body, "MessageTokensCount", path)

    def event(self, path: str, name: str | None, text: str, events: list[dict[str, Any]]) -> None:
        event = json.loads(text)
        events.append(event)
        if name != event.get("type"):
            self.fail(f"{path}: an `event: {name}` line for a {event.get('type')!r} event")
        if event.get("type") == "error":
            self._valid(anthropic_types.ErrorResponse, event, None, path)
            return
        if event.get("type") == "ping":  # a keep-alive, outside the SDK's event union
            if event != {"type": "ping"}:
                self.fail(f"{path}: a ping with members: {event}")
            return
        try:
            EVENT.validate_python(event)
        except pydantic.ValidationError as exc:
            self.fail(f"{path}: event {event.get('type')!r} is not Anthropic's: {exc}")
        if event["type"] == "message_start":
            self._valid(anthropic_types.Message, event["message"], "Message", path)

    def _valid(self, model: Any, body: Any, name: str | None, path: str) -> None:
        try:
            model.model_validate(body)
        except pydantic.ValidationError as exc:
            self.fail(f"{path}: not Anthropic's {model.__name__}: {exc}")
        if name is not None:
            errors = list(_contract(name).iter_errors(body))
            if errors:
                self.fail(f"{path}: fails the contract's {name}: {best_match(errors).message}")

    def fail(self, message: str) -> None:
        with self._lock:
            self.problems.append(message)
        raise AnthropicViolation(message)


class _Checked(http.SyncByteStream):
    """A response's bytes as the client reads them, each complete body or event checked."""

    def __init__(self, check: AnthropicCheck, path: str, response: http.Response) -> None:
        self.check, self.path, self.inner = check, path, response.stream
        self.status = response.status_code
        self.sse = response.headers.get("content-type", "").startswith("text/event-stream")
        self.buffer = b""
        self.events: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[bytes]:
        assert isinstance(self.inner, http.SyncByteStream)
        for chunk in self.inner:
            self.buffer += chunk
            if self.sse:
                self._blocks()
            yield chunk
        if not self.sse:
            self.check.body(self.path, self.status, self.buffer.decode("utf-8"))
            return
        self.check.streams.append(self.events)
        if not self.events or self.events[-1]["type"] not in ENDINGS:
            self.check.fail(f"{self.path}: the stream ended without message_stop or error")

    def _blocks(self) -> None:
        self.buffer = self.buffer.replace(b"\r\n", b"\n")
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            lines = block.decode("utf-8").split("\n")
            data = [line[6:] for line in lines if line.startswith("data: ")]
            names = [line[7:] for line in lines if line.startswith("event: ")]
            if data:
                self.check.event(self.path, names[0] if names else None, data[0], self.events)

    def close(self) -> None:
        self.inner.close()  # type: ignore[union-attr]


class _Transport(http.BaseTransport):
    def __init__(self, check: AnthropicCheck) -> None:
        self.check = check
        self.inner = http.HTTPTransport()

    def handle_request(self, request: http.Request) -> http.Response:
        response = self.inner.handle_request(request)
        path = request.url.path
        if path not in PATHS:
            return response
        stream = _Checked(self.check, path, response)
        return http.Response(
            response.status_code,
            headers=response.headers,
            stream=stream,
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self.inner.close()


def client(check: AnthropicCheck) -> http.Client:
    """An httpx client for the Anthropic SDK (`http_client=`) whose every response on the
    Messages routes `check` validates."""
    return http.Client(transport=_Transport(check), timeout=600.0, trust_env=False)
