"""The local server's session (LOC-INFO, LOC-LOAD, LOC-UNLOAD, LOC-CANCEL, LOC-EVENTS).

`Session` answers `GET /api/info`, loads and unloads on request (a load
answers `202` and runs in the background, its progress published as `state`
events), and publishes a `state` event whenever the model manager's state
moves. Loads and unloads take the generation slot, so they never overlap each
other or a generation (LOC-SEC-68): an unload first cancels the running
generation (LOC-UNLOAD-01).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import psutil

from ..engines.base import ENGINE_NAMES
from ..errors import ApiError
from ..events import EventBus
from ..models.experts import experts_used
from ..models.listing import architecture
from ..models.locator import ModelLocator
from ..models.manager import ModelManager
from ..models.registry import ModelEntry
from ..serving.chat.reasoning import format_of
from ..serving.chat.thinking import KEY
from ..serving.scheduler import Scheduler

log = logging.getLogger(__name__)
_MIB = 1024 * 1024


def think_ctl(template: str | None) -> str:
    """How thinking is switched (docs/DECISIONS.md, thinking): `template` when the chat
    template reads `enable_thinking`, `always` when it writes a reasoning span it cannot
    turn off, else `none` (LOC-INFO-14)."""
    if template and KEY in template:
        return "template"
    return "none" if format_of(template) is None else "always"


def version() -> str:
    try:
        return metadata.version("miserver")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Session:
    def __init__(
        self,
        manager: ModelManager,
        scheduler: Scheduler,
        bus: EventBus,
        *,
        launch_id: str | None,
        locator: ModelLocator,
    ) -> None:
        self._manager = manager
        self.locator = locator
        self._scheduler = scheduler
        self._bus = bus
        self._launch_id = launch_id
        self._tasks: set[asyncio.Task[None]] = set()
        self._loading = False  # from a load's 202 to its end (ready or error)
        self.planning = False  # an auto load measures the machine (LOC-INFO-08)
        self.generating = 0  # generations running now (the service counts them)
        manager.on_change = self.announce

    @contextmanager
    def generating_one(self) -> Iterator[None]:
        """One generation running: `generating` in /api/info and its `state` events
        (LOC-INFO-19)."""
        self.generating += 1
        self.announce()
        try:
            yield
        finally:
            self.generating -= 1
            self.announce()

    def announce(self) -> None:
        """A `state` event with the info object (LOC-EVENTS-05), built only for listeners."""
        if self._bus.listening:
            self._bus.publish("state", self.info())

    def info(self) -> dict[str, Any]:
        """`GET /api/info` (LOC-INFO-01)."""
        found, error = self._manager.session_state()
        state = "planning" if self.planning else found
        error = "" if self.planning else error
        memory = psutil.virtual_memory()
        return {
            "version": version(),
            "overlap_available": False,
            "planner_available": True,
            "host": {
                "ram_total_mib": memory.total // _MIB,
                "ram_available_mib": memory.available // _MIB,
                "cpu_threads": os.cpu_count() or 1,
            },
            "state": state,
            "error": error,
            "model": self._model() if state == "ready" else None,
            "generating": self.generating > 0,
        }

    def _model(self) -> dict[str, Any] | None:
        resident = self._manager.resident
        if resident is None:
            return None
        entry, engine = resident.entry, resident.engine
        threads = engine.facts.threads or (os.cpu_count() or 1)
        return {
            "id": entry.model_id,
            "path": str(entry.path),
            "name": entry.path.name,
            "arch": architecture(entry.path),
            "n_ctx": engine.facts.context_length,
            "think_ctl": think_ctl(engine.chat_template),
            "load_s": round(self._manager.load_seconds, 3),
            "n_expert_used": experts_used(entry.path),
            "streaming": False,
            "engine": ENGINE_NAMES[entry.engine],
            "compute_threads": threads,
            "busy_threads": threads,
        }

    # -- load and unload -----------------------------------------------------------

    def target(self, model: str | None, *, peer_local: bool, engine: str = "auto") -> ModelEntry:
        """The entry a load names (the launch model when none): refusals before the 202,
        a path outside the model folders among them (LOC-SEC-61)."""
        name = model or self._launch_id
        if name is None:
            raise ApiError("no_model", "No model is configured; name one in `model`.", "model")
        entry = self.locator.find(name, peer_local=peer_local, engine=engine)
        self._manager.check_lock(entry)
        self._manager.check_loadable(entry)
        return entry

    def refuse_if_loading(self) -> None:
        """409 busy while a load (or an auto load's planning) runs, this session's or a
        request's (docs/DECISIONS.md)."""
        if self._loading or self.planning or self._manager.switching:
            raise ApiError(
                "busy",
                "A model load is already under way; wait for its `state` event "
                "(ready or error), then load again.",
            )

    def load(self, entry: ModelEntry) -> None:
        """Start loading `entry` in the background (LOC-LOAD-05); its end is a `state` event."""
        self.refuse_if_loading()
        self._loading = True
        task = asyncio.get_running_loop().create_task(self._load(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, entry: ModelEntry) -> None:
        """The load itself; `_loading` ends with it, before anyone can see its `state`."""
        try:
            if self._manager.engine_if_resident(entry) is None:
                self._scheduler.cancel_holder()  # the session is replaced: its generation ends
            async with self._scheduler.hold(front=True):
                await self._manager.ensure(entry)
        except ApiError as exc:  # the manager recorded why; the state event says so
            log.warning("session load failed: %s", exc.message)
        finally:
            self._loading = False

    async def unload(self) -> bool:
        """Cancel the running generation, then release the model (LOC-UNLOAD-01)."""
        self._scheduler.cancel_holder()
        async with self._scheduler.hold(front=True):
            return await self._manager.unload()
