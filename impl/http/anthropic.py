"""Anthropic's conventions on the Messages routes (`/v1/messages`, its `count_tokens`).

Every error there, whoever raised it (the security model, the body validator, a handler,
the queue), leaves in Anthropic's shape: `{"type": "error", "error": {"type", "message",
"code", "param"}, "request_id"}`, its `type` from the status (errors.py `ANTHROPIC_TYPES`),
and a 503 (a full queue, no model able to serve now) as Anthropic's `529 overloaded_error`.
`x-api-key`, which Anthropic's clients send, is taken as the API key when no
`Authorization` is sent: a header a cross-site form cannot send, as `Authorization` is, so
the security model holds unchanged. Every response carries Anthropic's `request-id` beside
`x-request-id`. Other routes pass through untouched.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import anthropic_error, anthropic_status
from ..request_context import HEADER

PATHS = ("/v1/messages", "/v1/messages/count_tokens")
REQUEST_ID = b"request-id"
_RAW_REQUEST_ID = HEADER.encode("latin-1")


class AnthropicConventions:
    """Anthropic's error shape, `x-api-key` and `request-id` on the Messages routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        scope = _with_key(scope)
        start: Message | None = None
        held: list[bytes] = []

        async def sending(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                message = {**message, "headers": _with_request_id(message.get("headers", []))}
                if message["status"] < 400:
                    await send(message)
                else:
                    start = message  # an error's body is rewritten whole, once it is read
                return
            if start is None:
                await send(message)
                return
            held.append(message.get("body", b""))
            if not message.get("more_body", False):
                status, body = _rewritten(start, b"".join(held))
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode("ascii")))
                await send({**start, "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, sending)


def _with_key(scope: Scope) -> Scope:
    """`x-api-key` as `Authorization: Bearer` where no `Authorization` is sent."""
    headers = Headers(scope=scope)
    key = headers.get("x-api-key")
    if key is None or "authorization" in headers:
        return scope
    raw = [*scope["headers"], (b"authorization", b"Bearer " + key.encode("latin-1"))]
    return {**scope, "headers": raw}


def _with_request_id(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    rid = next((v for k, v in headers if k.lower() == _RAW_REQUEST_ID), None)
    kept = [(k, v) for k, v in headers if k.lower() != REQUEST_ID]
    return kept if rid is None else [*kept, (REQUEST_ID, rid)]


def _rewritten(start: Message, body: bytes) -> tuple[int, bytes]:
    """An error response's status and body in Anthropic's shape (a body that is not an
    OpenAI-format error keeps its message as text)."""
    status = int(start["status"])
    try:
        found: Any = json.loads(body)
    except ValueError:
        found = None
    error = found.get("error") if isinstance(found, dict) else None
    if not isinstance(error, dict):
        error = {"message": body.decode("utf-8", "replace") or f"HTTP {status}"}
    rid = next((v for k, v in start["headers"] if k.lower() == REQUEST_ID), b"")
    out = {
        "type": "error",
        "error": anthropic_error(error, status),
        "request_id": rid.decode("latin-1"),
    }
    return anthropic_status(status), json.dumps(out, ensure_ascii=False).encode("utf-8")
