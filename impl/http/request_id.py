"""The `x-request-id` of every response, set by the outermost middleware.

The id is chosen as request_context.py says and is `request_context.current()` while
the app runs, so log records and /api/events carry the same id.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..request_context import HEADER, bound, chosen

_RAW_HEADER = HEADER.encode("latin-1")


class RequestIdMiddleware:
    """The outermost middleware: picks the id, holds it while the app runs, and sets the
    `x-request-id` header on the response (refusals, errors and streams alike)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = chosen(Headers(scope=scope).getlist(HEADER))
        raw = (_RAW_HEADER, rid.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != _RAW_HEADER]
                message = {**message, "headers": [*kept, raw]}
            await send(message)

        with bound(rid):
            await self.app(scope, receive, send_with_id)
