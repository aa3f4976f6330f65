"""The ingress: the contract at the cluster's door, running no model.

Its server is miserver's whole ASGI stack (the security model, the strict body
reader, Connexion's validation against spec/openapi) with every operation
sent on once validated (forwarding.py): a bad request is refused here, in the
route's documented shape, and never reaches a replica. It follows the control's
epoch as it moves, so each request it admits is stamped with the epoch of every
change made before it, through any ingress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ray.serve.handle import DeploymentHandle

from ..app import Server
from . import options
from .forwarding import Forwarder

log = logging.getLogger(__name__)

FOLLOW_RETRY_S = 1.0


class Ingress:
    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        argv: Sequence[str],
        key: str,
        engine: DeploymentHandle[Any],
        control: DeploymentHandle[Any],
    ) -> None:
        settings, flags = options.parsed(argv, facing=True)
        self._forwarder = Forwarder(engine, key, control)
        self._control = control
        self._server = Server(
            settings, preload=False, flags=flags, route=self._forwarder.route, batches=False
        )
        self._following = asyncio.create_task(self._follow())

    def __serve_build_asgi_app__(self) -> Server:
        return self._server

    async def _follow(self) -> None:
        while True:
            try:
                self._forwarder.learn(await self._control.wait_epoch.remote(self._forwarder.epoch))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the control restarting: try again shortly
                log.info("ingress: following the control's epoch: %s", exc)
                await asyncio.sleep(FOLLOW_RETRY_S)
