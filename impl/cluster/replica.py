"""An engine replica: one engine and its serving core, a whole miserver server in process.

It answers requests through its own server's ASGI stack, adding `X-miLLM-Replica`
and `X-miLLM-Epoch`: an ingress's on its own port (hop.py), the control's
`Forwarded` ones (wire.py) through its handle, the messages streamed back.
Before it serves a request stamped with a later epoch than its own it catches
up: it reads the operator's state again from the shared database (the
control's change is stored before the epoch moves) and, when the session's
model changed, loads it as the change asked. It also follows the control's
epoch as it moves (a long poll), so it is usually there before the request.
A replica Ray restarts after a crash catches up the same way before it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from starlette.types import Message, Receive, Scope, Send

from ..app import Server
from ..http import inprocess
from ..serving.scheduler import in_background
from ..store.epochs import EpochStore
from . import hop, options, relay
from .wire import EPOCH, REPLICA, Forwarded

log = logging.getLogger(__name__)

FOLLOW_RETRY_S = 1.0


@dataclass(slots=True)
class _Applied:
    epoch: int = -1  # the cluster epoch this replica's state is at
    session: int = 0  # the epoch of the session change it ran last


class EngineReplica:
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self, argv: Sequence[str], key: str
    ) -> None:
        settings, flags = options.parsed(argv, facing=False)
        assigned = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
        settings = options.engine_threads(settings, float(assigned.get("CPU", 0.0)))
        self._key = key.encode()
        self._server = Server(settings, flags=flags, batches=False)
        self._epochs = EpochStore(self._server.database)
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self._app = context.app_name
        self._applied = _Applied()
        self._lock = asyncio.Lock()
        await self._server.startup()
        await self.catch_up(self._epochs.epoch())
        self._control: Any = None
        self._following = asyncio.create_task(self._follow())
        self._relaying = asyncio.create_task(self._relay())
        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._port = hop.Port(self._http, str(address))
        endpoint = await self._port.start()
        log.info(
            "engine replica %s serving at epoch %d on %s", self.name, self._applied.epoch, endpoint
        )

    def record_replica_metadata(self) -> dict[str, str]:
        """What Serve gives the router about this replica: where its port is (hop.py)."""
        return {hop.ENDPOINT: self._port.endpoint}

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An ingress's request on this replica's port: served at its admitted epoch or
        later, as a `Forwarded` is."""
        stamped = hop.admitted(scope["headers"], self._key)
        if stamped is None:
            await send({"type": "http.response.start", "status": 403, "headers": []})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        inner = inprocess.scope_of(
            scope["method"], scope["path"], scope["query_string"], stamped.headers
        )

        async def marked(message: Message) -> None:
            await send(self._marked(message))

        async with self._admitted(stamped.epoch, stamped.background):
            await self._server(inner, receive, marked)

    @property
    def epoch(self) -> int:
        return self._applied.epoch

    async def serve(self, forwarded: Forwarded) -> AsyncIterator[list[Message]]:
        """The server's answer to `forwarded`, its messages in lists as they come (each item
        crossing a handle costs, so what is ready crosses together)."""
        scope = inprocess.scope_of(
            forwarded.method, forwarded.path, forwarded.query, forwarded.headers
        )
        async with self._admitted(forwarded.epoch, forwarded.background):
            held: list[Message] = []  # a stream's start waits for its first event
            async for messages in inprocess.exchange(self._server, scope, forwarded.body):
                ready = [*held, *map(self._marked, messages)]
                held = ready if all(m["type"] == "http.response.start" for m in ready) else []
                if not held:
                    yield ready
            if held:
                yield held

    @contextlib.asynccontextmanager
    async def _admitted(self, epoch: int, background: bool) -> AsyncIterator[None]:
        """Serving a request the ingress admitted at `epoch`: this replica caught up to it
        first; a Batch API line's asks in the background here as it would on the control's
        server."""
        if epoch > self._applied.epoch:
            await self.catch_up(epoch)
        with in_background() if background else contextlib.nullcontext():
            yield

    def _marked(self, message: Message) -> Message:
        """A response's start with X-miLLM-Replica and X-miLLM-Epoch added."""
        if message["type"] != "http.response.start":
            return message
        marks = [(REPLICA, self.name.encode()), (EPOCH, str(self.epoch).encode())]
        return {**message, "headers": [*message.get("headers", []), *marks]}

    async def catch_up(self, epoch: int) -> None:
        """This replica's state brought to `epoch` (or later) from the shared database."""
        async with self._lock:
            if epoch <= self._applied.epoch:
                return
            record = self._epochs.session()
            if record is not None and record.epoch > self._applied.session:
                answer = await inprocess.post(self._server, record.path, record.body)
                if answer.status >= 400:
                    log.error(
                        "replica %s could not follow %s: %s", self.name, record.path, answer.body
                    )
                self._applied.session = record.epoch
            self._server.reload(epoch)
            self._applied.epoch = epoch

    def _controller(self) -> Any:
        if self._control is None:
            self._control = serve.get_deployment_handle("Control", app_name=self._app)
        return self._control

    async def _follow(self) -> None:
        """Catch up each time the control's epoch moves."""
        while True:
            try:
                epoch = await self._controller().wait_epoch.remote(self._applied.epoch)
                await self.catch_up(epoch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control restarting: try again shortly
                log.info("replica %s: following the control's epoch: %s", self.name, exc)
                await asyncio.sleep(FOLLOW_RETRY_S)

    async def _relay(self) -> None:
        """This replica's events to the control while an ingress listens (relay.py)."""
        while True:
            try:
                await relay.sending(self._server.bus, self._controller())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control restarting: try again shortly
                log.info("replica %s: relaying events: %s", self.name, exc)
                await asyncio.sleep(FOLLOW_RETRY_S)
