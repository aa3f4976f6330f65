"""A request to this server made in process, through its whole ASGI stack (Batch API lines,
and a cluster's engine replicas: miserver.cluster).

`post` sends one JSON body to a path as a loopback HTTP client would, through
every middleware a socket request passes (the security checks, the strict body
reader, the request id, Connexion's validation), and collects the answer:
status, headers and body. So a Batch API line gets exactly the answer, headers
and refusals an HTTP client would get for the same body (REQ-000 open point 2).
Once the body is read, the client never leaves: `receive` answers
`http.disconnect` only after the response is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.types import ASGIApp, Message

from ..serving.batches.lines import Answer

HOST = b"127.0.0.1"


async def post(app: ASGIApp, path: str, body: bytes, *, key: bytes | None = None) -> Answer:
    """POST `body` (JSON) to `path` on `app`; `key` is the server's API key, when it has one."""
    headers = [
        (b"host", HOST),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if key is not None:
        headers.append((b"authorization", b"Bearer " + key))
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": (HOST.decode(), 0),
        "server": (HOST.decode(), 0),
    }
    collected = _Collected()
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await collected.complete.wait()
        return {"type": "http.disconnect"}

    await app(scope, receive, collected.send)
    return collected.answer()


def scope_of(
    method: str, path: str, query: bytes, headers: Sequence[tuple[bytes, bytes]]
) -> dict[str, Any]:
    """The ASGI scope of a request made in process from loopback."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", HOST), *headers],
        "client": (HOST.decode(), 0),
        "server": (HOST.decode(), 0),
    }


async def exchange(
    app: ASGIApp, scope: dict[str, Any], body: bytes
) -> AsyncIterator[list[Message]]:
    """Run `app` on one request and yield what it sends as it sends it, in lists: all it
    sent since the last one (a JSON reply's start and body in one list, a stream's events
    one by one while they come apart). Closing the iterator early is the client leaving:
    the app's `receive` answers `http.disconnect`, and the app is cancelled if it does not
    end by itself."""
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    left = asyncio.Event()
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(scope, receive, sent.put)
        finally:
            sent.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        ended = False
        while not ended:
            batch = [await sent.get()]
            while not sent.empty():
                batch.append(sent.get_nowait())
            ended = batch[-1] is None
            found = [m for m in batch if m is not None]
            if found:
                yield found
        await task  # its exception, if it raised one
    finally:
        left.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class _Collected:
    def __init__(self) -> None:
        self.status = 500
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.complete = asyncio.Event()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = {
                name.decode("latin-1").lower(): value.decode("latin-1")
                for name, value in message.get("headers", [])
            }
        elif message["type"] == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.complete.set()

    def answer(self) -> Answer:
        self.complete.set()
        return Answer(self.status, self.headers, b"".join(self.chunks))
