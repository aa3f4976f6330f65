"""Sending validated requests on to the deployment that answers them.

A `Forwarder` is the `Route` (http/operations.py) of the ingress's server and of
the control's: once Connexion has validated a request, its operation sends it
on as a `Forwarded` (wire.py), stamped with the highest cluster epoch this
process has seen, and relays the answer as it comes, a stream's events one by
one. A request for an engine replica goes to the replica Serve's router picks
(router.py), over HTTP to that replica's own port (hop.py); the control's
operations go through its handle.

A replica lost before its answer started (killed, restarting) costs the client
nothing: the request goes to another replica, once. Lost after it started, a
stream ends with one error event and a JSON reply ends where it was cut; with no
replica to take it, `503 replica_unavailable` with `Retry-After`. Never a 500.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ApiError
from ..http.body import BODY_KEY
from ..http.sse import data
from ..request_context import HEADER, current
from ..serving.scheduler import backgrounded
from . import relay
from .affinity import affinity
from .hop import ENDPOINT, Hop, ReplicaLost
from .router import PICK, inflight
from .routes import Target, target
from .wire import EPOCH, Forwarded, header, kept_headers

log = logging.getLogger(__name__)

LOST = (RayActorError, ReplicaUnavailableError, DeploymentUnavailableError, ReplicaLost)
ATTEMPTS = 2  # a request whose replica was lost before it answered goes to one other
RETRY_AFTER_S = 2


def unavailable() -> ApiError:
    return ApiError(
        "replica_unavailable",
        "No engine replica could take the request (one was lost and is being restarted); "
        "retry shortly.",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class Forwarder:
    """Sends a server's operations on: to the engine replicas, and (on the ingress) to the
    control. `local` are the targets this server answers itself."""

    def __init__(
        self,
        engine: DeploymentHandle[Any],
        key: str,
        control: DeploymentHandle[Any] | None = None,
        *,
        local: frozenset[Target] = frozenset(),
    ) -> None:
        self._engine = engine.options(stream=True, method_name="serve")
        self._picker = engine.options(method_name="serve")
        self._hop = Hop(key.encode())
        self._control = control
        self._local = local
        self.epoch = 0  # the highest cluster epoch this process has seen

    def route(self, operation_id: str) -> ASGIApp | None:
        """What answers `operation_id` here (None: its own handler)."""
        where = target(operation_id)
        if where in self._local:
            return None
        name = operation_id.rpartition(".")[2]
        if self._control is None or where is Target.ENGINE:
            return functools.partial(self._to_engine, name)
        if where is Target.EVENTS:
            return relay.listened(self._control, self._info)
        send_on = {
            Target.OPERATOR: self._to_operator,
            Target.BATCHES: self._to_batches,
            Target.EVERY: self._to_every,
        }[where]
        return functools.partial(send_on, name)

    def learn(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)

    async def _info(self) -> dict[str, Any]:
        """An engine replica's `GET /api/info`: the session's state."""
        asked = Forwarded("GET", "/api/info", b"", (), b"", self.epoch, operation="info")
        _, body = await _whole(self._engine.remote(asked))
        found: dict[str, Any] = json.loads(body)
        return found

    async def _forwarded(self, operation: str, scope: Scope, receive: Receive) -> Forwarded:
        headers = kept_headers(scope["headers"])
        rid = current()
        if rid is not None:  # the replica logs and answers under the ingress's id
            kept = (h for h in headers if h[0].lower() != HEADER.encode())
            headers = (*kept, (HEADER.encode(), rid.encode()))
        return Forwarded(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b""),
            headers=headers,
            body=await _body(receive),
            epoch=self.epoch,
            operation=operation,
            affinity=affinity(scope.get(BODY_KEY)),
            background=backgrounded(),
        )

    async def _to_engine(self, operation: str, scope: Scope, receive: Receive, send: Send) -> None:
        forwarded = await self._forwarded(operation, scope, receive)
        tried: set[str] = set()  # a second try (its replica was lost) goes elsewhere

        async def answer() -> AsyncGenerator[Message, None]:
            asked = dataclasses.replace(forwarded, avoid=frozenset(tried))
            async with self._picker.choose_replica(asked, **PICK) as chosen:
                name, endpoint = chosen.replica_id, chosen.replica_metadata.get(ENDPOINT)
            tried.add(name)
            if not endpoint:
                raise ReplicaLost(f"replica {name} names no port")
            inflight[name] += 1
            try:
                async for message in self._hop.messages(endpoint, forwarded):
                    yield message
            finally:
                inflight[name] -= 1

        await self._relay(answer, send)

    async def _to_batches(self, operation: str, scope: Scope, receive: Receive, send: Send) -> None:
        assert self._control is not None
        forwarded = await self._forwarded(operation, scope, receive)
        serving = self._control.options(stream=True, method_name="serve")
        await self._relay(lambda: _streamed(serving.remote(forwarded)), send, attempts=1)

    async def _to_operator(
        self, operation: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A change of operator state: the control runs it once and moves the epoch."""
        assert self._control is not None
        forwarded = await self._forwarded(operation, scope, receive)
        try:
            epoch, messages = await self._control.options(method_name="mutate").remote(forwarded)
        except LOST as exc:
            log.warning("the control was lost: %s", exc)
            raise unavailable() from None
        self.learn(epoch)
        for message in messages:
            await send(message)

    async def _to_every(self, operation: str, scope: Scope, receive: Receive, send: Send) -> None:
        """An operation every replica answers: the control sends it to each."""
        assert self._control is not None
        forwarded = await self._forwarded(operation, scope, receive)
        try:
            messages = await self._control.options(method_name="everywhere").remote(forwarded)
        except LOST as exc:
            log.warning("the control was lost: %s", exc)
            raise unavailable() from None
        for message in messages:
            await send(message)

    async def collected(self, forwarded: Forwarded, within_s: float) -> tuple[int, bytes] | None:
        """One replica's whole answer to `forwarded` (its status and body), or None when no
        replica answered within `within_s`."""
        try:
            return await asyncio.wait_for(_whole(self._engine.remote(forwarded)), within_s)
        except (TimeoutError, *LOST) as exc:
            log.info("no answer from replica %s: %r", forwarded.replica, exc)
            return None

    async def _relay(
        self,
        answer: Callable[[], AsyncGenerator[Message, None]],
        send: Send,
        attempts: int = ATTEMPTS,
    ) -> None:
        """Each message of `answer()` sent on; a replica lost before it started answering
        costs a second `answer()`, lost after, the answer's end (`_cut`)."""
        for attempt in range(attempts):
            stream = answer()
            started = streamed = False
            try:
                async for message in stream:
                    if message["type"] == "http.response.start":
                        started = True
                        streamed = header(message["headers"], b"content-type").startswith(
                            "text/event-stream"
                        )
                        self.learn(int(header(message["headers"], EPOCH) or 0))
                    await send(message)
                return
            except LOST as exc:
                log.warning("replica lost (try %d of %d): %s", attempt + 1, attempts, exc)
                if started:
                    await _cut(send, streamed)
                    return
            finally:  # the client left, or the replica was lost: stop its work
                await stream.aclose()
        raise unavailable()


async def _whole(stream: Any) -> tuple[int, bytes]:
    """A replica's whole answer: its status and its body."""
    status, body = 500, []
    async for message in _messages(stream):
        if message["type"] == "http.response.start":
            status = int(message["status"])
        else:
            body.append(message.get("body", b""))
    return status, b"".join(body)


async def _messages(stream: Any) -> AsyncIterator[Message]:
    """The messages of a replica's answer, which come in lists."""
    async for batch in stream:
        for message in batch:
            yield message


async def _streamed(stream: Any) -> AsyncGenerator[Message, None]:
    """A handle's streamed answer as messages; cancelled when left before its end."""
    ended = False
    try:
        async for message in _messages(stream):
            yield message
        ended = True
    finally:
        if not ended:
            stream.cancel()


async def _cut(send: Send, streamed: bool) -> None:
    """The end of an answer whose replica was lost after it started."""
    body = data(unavailable().body()) if streamed else b""
    await send({"type": "http.response.body", "body": body, "more_body": False})
