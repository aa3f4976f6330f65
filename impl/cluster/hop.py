"""The hop from an ingress to an engine replica: plain HTTP to the replica's own port.

Each engine replica serves its server's ASGI stack on a port of its own (`Port`,
on its node's address, a port the system picks) and names it in the metadata
Serve gives the router (`ENDPOINT`). The ingress picks a replica through Serve's
router (router.py), then sends the validated request there over a kept-alive
connection (`Hop`) and relays the answer's bytes as they come, a stream's
events one by one. A Serve handle's stream costs about a millisecond more per
item than a loopback HTTP chunk (BENCHMARKS.md, the cluster's TTFT), and a
stream's first token crosses it twice.

What the ingress decided travels in headers only a holder of the cluster's key
may set: the epoch the request was admitted at (`STAMP`) and whether it is a
Batch API line's (`BACKGROUND`). A request to a replica's port without the key
is refused (`KEY`): the port is the cluster's, not the clients'.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import uvicorn
from starlette.types import ASGIApp, Message

from .wire import Forwarded

ENDPOINT = "http"  # the replica's metadata key: "host:port"
KEY = b"x-millm-cluster-key"
STAMP = b"x-millm-admitted-epoch"
BACKGROUND = b"x-millm-background"
INTERNAL = frozenset({KEY, STAMP, BACKGROUND})
# what the hop's own HTTP sets, never relayed to the client: the ingress's server frames
# the answer again (uvicorn writes its own date and framing)
FRAMING = frozenset({b"transfer-encoding", b"connection", b"keep-alive", b"date", b"server"})
CONNECT_S = 5.0


class ReplicaLost(ConnectionError):
    """The replica's port could not be reached, or closed before the answer ended."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the ingress stamped on a request it sent on."""

    epoch: int
    background: bool
    headers: tuple[tuple[bytes, bytes], ...]  # the request's own, the internal ones removed


def admitted(headers: Sequence[tuple[bytes, bytes]], key: bytes) -> Admitted | None:
    """The stamp of a request that holds the cluster's key; None for one that does not."""
    found = {k.lower(): v for k, v in headers if k.lower() in INTERNAL}
    if not hmac.compare_digest(found.get(KEY, b""), key):
        return None
    kept = tuple((k, v) for k, v in headers if k.lower() not in INTERNAL and k.lower() != b"host")
    epoch = found.get(STAMP, b"0")
    return Admitted(int(epoch) if epoch.isdigit() else 0, found.get(BACKGROUND) == b"1", kept)


class Port:
    """An ASGI app served on this node's address, on a port the system picks."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=0,
            interface="asgi3",
            lifespan="off",
            access_log=False,
            log_level="warning",
        )
        self._server = uvicorn.Server(config)
        self._serving: asyncio.Task[None] | None = None
        self.endpoint = ""

    async def start(self) -> str:
        self._serving = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._serving.done():  # it could not bind: its exception
                self._serving.result()
            await asyncio.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.endpoint = f"{host}:{port}"
        return self.endpoint


class Hop:
    """The ingress's connections to the replicas' ports (kept alive, one pool)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_S),
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def messages(self, endpoint: str, forwarded: Forwarded) -> AsyncIterator[Message]:
        """The replica's answer to `forwarded` as ASGI messages, as its bytes come; closing
        the iterator early closes the connection, which the replica reads as the client
        leaving. Raises ReplicaLost when the replica cannot be reached or goes away."""
        url = f"http://{endpoint}{forwarded.path}"
        if forwarded.query:
            url += "?" + forwarded.query.decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in forwarded.headers]
        headers += [
            (KEY.decode(), self._key.decode()),
            (STAMP.decode(), str(forwarded.epoch)),
            (BACKGROUND.decode(), "1" if forwarded.background else "0"),
        ]
        try:
            async with self._opened().request(
                forwarded.method, url, headers=headers, data=forwarded.body or None
            ) as answer:
                kept = [(k, v) for k, v in answer.raw_headers if k.lower() not in FRAMING]
                yield {"type": "http.response.start", "status": answer.status, "headers": kept}
                async for chunk in answer.content.iter_any():
                    yield {"type": "http.response.body", "body": chunk, "more_body": True}
                yield {"type": "http.response.body", "body": b"", "more_body": False}
        except (aiohttp.ClientError, OSError) as exc:
            raise ReplicaLost(f"replica at {endpoint}: {exc!r}") from exc
