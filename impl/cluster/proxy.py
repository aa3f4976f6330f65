"""Ray Serve's HTTP proxy, told that the ingress already sets `X-Request-Id`.

Serve's proxy appends an `X-Request-ID` header of its own to every response:
its id, which is the client's header verbatim when one was sent. The ingress
sets the header as a single server does (a sane client id echoed, anything
else replaced by a fresh `req_` id: http/request_id.py), so the proxy's copy
is at best a duplicate, which a client reads as `id, id`. `OneRequestId` keeps
the first one, the ingress's. Serve calls `middlewares` where
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` names it (`miserver cluster` sets it
for its local head; docs/CLUSTER.md for a RayService).
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CALLBACK = "miserver.cluster.proxy:middlewares"  # RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH
_HEADER = b"x-request-id"


class OneRequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def once(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": first_id_only(message.get("headers", []))}
            await send(message)

        await self.app(scope, receive, once)


def first_id_only(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept, seen = [], False
    for name, value in headers:
        if name.lower() == _HEADER:
            if seen:
                continue
            seen = True
        kept.append((name, value))
    return kept


def middlewares() -> list[Middleware]:
    """Serve's proxy callback: the middlewares it wraps around its own."""
    return [Middleware(OneRequestId)]
