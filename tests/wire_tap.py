"""A recording reverse proxy between a real client that is not Python (a coding agent) and a
live miserver: every exchange is kept (the request's JSON, the status, the headers, each
stream event), and every `/v1` body and event is checked against OpenAI's schemas on the way
(tests/openai_reference.py), as an SDK client's would be.

    tap = Tap(upstream="http://127.0.0.1:PORT", check=Check())
    with uvicorn_serving(tap) as port: ...  # the client is pointed at http://127.0.0.1:port

Bytes pass through as the server sends them (a stream stays a stream); only the hop's own
headers are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from tests.openai_reference import Check, async_client

HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding"})


@dataclass(slots=True)
class Exchange:
    """One request through the tap and what the server answered."""

    method: str
    path: str
    request: Any  # the JSON body, or None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def streamed(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def events(self) -> list[Any]:
        """Each `data:` event of a stream as JSON, `[DONE]` left out."""
        out = []
        for block in self.body.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
            data = [line[5:].strip() for line in block.split("\n") if line.startswith("data:")]
            if data and data != ["[DONE]"]:
                out.append(json.loads("\n".join(data)))
        return out


@dataclass(slots=True)
class Tap:
    """The proxy (an ASGI app); `exchanges` in the order they ended."""

    upstream: str
    check: Check
    exchanges: list[Exchange] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        exchange = Exchange(scope["method"], scope["path"], json.loads(body) if body else None)
        query = scope["query_string"].decode("latin-1")
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in HOP
        ]
        async with async_client(self.check) as client:
            request = client.build_request(
                scope["method"],
                self.upstream + scope["path"] + (f"?{query}" if query else ""),
                headers=headers,
                content=body,
            )
            response = await client.send(request, stream=True)
            exchange.status = response.status_code
            exchange.headers = {k.lower(): v for k, v in response.headers.items()}
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.headers.items()
                        if k.lower() not in HOP
                    ],
                }
            )
            try:
                async for chunk in response.aiter_raw():
                    exchange.body += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                await response.aclose()
                self.exchanges.append(exchange)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
