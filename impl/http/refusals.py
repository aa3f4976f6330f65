"""Counts every error answer by its code, where it is answered (`miserver_refusals_total`).

Inside the Anthropic layer and outside the security middleware, so a refusal of the
security model, of validation, of a handler or of the queue is seen once, in OpenAI's shape
(`{"error": {"code": ...}}`), whoever wrote it. Only a response with a 4xx or 5xx status and
a JSON body is read; every other passes untouched. An error inside a stream already under
way (an `error` event after the 200) is not a refusal and is not counted here.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import Metrics

UNREADABLE = "unreadable"  # an error body that names no code


class Refusals:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.metrics.on:
            await self.app(scope, receive, send)
            return
        body: list[bytes] | None = None

        async def counted(message: Message) -> None:
            nonlocal body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                headers = dict(message.get("headers", []))
                if headers.get(b"content-type", b"").startswith(b"application/json"):
                    body = []
            elif message["type"] == "http.response.body" and body is not None:
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.metrics.refused(_code(b"".join(body)))
                    body = None
            await send(message)

        await self.app(scope, receive, counted)


def _code(raw: bytes) -> str:
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return UNREADABLE
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) and code else UNREADABLE
