"""The control: the one deployment that changes the operator's state, and runs batches.

A change of operator state (routes.OPERATOR: steering, profiles, circuits,
probes, the model lock, the config, the session's model) comes here from an
ingress. Under one lock, the control runs it on one engine replica, which
checks it against its model and stores it in the shared database; if it
succeeded, the control moves the cluster's epoch (stored beside it, with the
change itself when it loaded or unloaded a model) and wakes every replica and
ingress that follows the epoch. Requests stamped with the new epoch are served
only by replicas that have caught up (replica.py).

The control's own server answers the Files and Batch APIs (routes.BATCHES),
and its batch runner posts each line through that server, whose routes send
the line on to the engine replicas like any request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.types import Message

from ..app import Server
from ..http import inprocess
from ..store.epochs import EpochStore
from . import options
from .forwarding import LOST, Forwarder, unavailable
from .relay import Events, Published
from .routes import EVERY, SESSION, Target
from .wire import EPOCH, Forwarded

log = logging.getLogger(__name__)

WAIT_S = 25.0  # how long a follower's long poll waits for the epoch to move
EVERY_S = 5.0  # how long an operation sent to every replica waits for each


class Control:
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self, argv: Sequence[str], key: str, engine: DeploymentHandle[Any]
    ) -> None:
        settings, flags = options.parsed(argv, facing=False)
        self._forwarder = Forwarder(engine, key, local=frozenset({Target.BATCHES}))
        self._engine = engine.options(stream=True, method_name="serve")
        self._server = Server(settings, preload=False, flags=flags, route=self._forwarder.route)
        self._epochs = EpochStore(self._server.database)
        self._forwarder.learn(self._epochs.epoch())
        self._moved = asyncio.Condition()
        self._changing = asyncio.Lock()
        self._events = Events()
        self._app = serve.get_replica_context().app_name
        await self._server.startup()  # kept batches go on where they stopped

    def epoch(self) -> int:
        return self._forwarder.epoch

    async def wait_epoch(self, after: int) -> int:
        """The epoch, once it is past `after` (or after WAIT_S)."""
        async with self._moved:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._moved.wait_for(lambda: self._forwarder.epoch > after), WAIT_S
                )
        return self._forwarder.epoch

    async def mutate(self, forwarded: Forwarded) -> tuple[int, list[Message]]:
        """Run one change of operator state; the epoch after it, and the answer's messages."""
        async with self._changing:
            stamped = dataclasses.replace(forwarded, epoch=self._forwarder.epoch)
            try:
                answer = cast(
                    DeploymentResponseGenerator[list[Message]], self._engine.remote(stamped)
                )
                messages = [m async for batch in answer for m in batch]
            except LOST as exc:
                log.warning("a replica was lost during %s: %s", forwarded.path, exc)
                await self._move(None)  # it may have stored the change: catch up anyway
                error = unavailable()
                return self._forwarder.epoch, _answer(
                    error.status, error.body_bytes(), error.headers
                )
            if int(messages[0]["status"]) < 400:
                session = forwarded.operation in SESSION
                await self._move((forwarded.path, forwarded.body) if session else None)
            epoch = self._forwarder.epoch
            start = messages[0]
            kept = [(k, v) for k, v in start.get("headers", []) if k.lower() != EPOCH]
            messages[0] = {**start, "headers": [*kept, (EPOCH, str(epoch).encode())]}
            return epoch, messages

    async def everywhere(self, forwarded: Forwarded) -> list[Message]:
        """An operation every live replica answers (routes.EVERY), the answers merged."""
        live = await asyncio.to_thread(self._engine_replicas)
        asked = [dataclasses.replace(forwarded, replica=name) for name in live]
        answers = await asyncio.gather(*(self._forwarder.collected(a, EVERY_S) for a in asked))
        found = [
            (name, answer[1])
            for name, answer in zip(live, answers, strict=True)
            if answer is not None and answer[0] == 200
        ]
        refused = [answer for answer in answers if answer is not None and answer[0] != 200]
        if refused and not found:  # every replica refused it (metrics off): its refusal
            return _answer(*refused[0], {})
        body, media_type = EVERY[forwarded.operation](found)
        return _answer(200, body, {}, media_type)

    def _engine_replicas(self) -> list[str]:
        """The engine replicas alive now, from Ray's named actors
        (`SERVE_REPLICA::<app>#EngineReplica#<replica id>`)."""
        prefix = f"SERVE_REPLICA::{self._app}#EngineReplica#"
        named = ray.util.list_named_actors(all_namespaces=True)
        return [n["name"].removeprefix(prefix) for n in named if n["name"].startswith(prefix)]

    async def publish(self, events: list[Published]) -> bool:
        """A replica's events (relay.py); whether an ingress still listens."""
        return await self._events.publish(events)

    async def wait_listening(self) -> bool:
        return await self._events.wait_listening()

    async def events_after(
        self, listener: str, seq: int | None, wait_s: float = WAIT_S
    ) -> tuple[int, list[Published]]:
        return await self._events.after(listener, seq, wait_s)

    def leave_events(self, listener: str) -> None:
        self._events.leave(listener)

    async def serve(self, forwarded: Forwarded) -> AsyncIterator[list[Message]]:
        """The control's own server's answer: files and batches."""
        scope = inprocess.scope_of(
            forwarded.method, forwarded.path, forwarded.query, forwarded.headers
        )
        async for messages in inprocess.exchange(self._server, scope, forwarded.body):
            yield messages

    async def _move(self, session: tuple[str, bytes] | None) -> None:
        epoch = self._epochs.moved(session)
        self._forwarder.learn(epoch)
        async with self._moved:
            self._moved.notify_all()
        log.info("cluster epoch %d", epoch)


def _answer(
    status: int, body: bytes, headers: dict[str, str], media_type: str = "application/json"
) -> list[Message]:
    pairs = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return [
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", media_type.encode()), *pairs],
        },
        {"type": "http.response.body", "body": body, "more_body": False},
    ]
