"""The resident model: its lifecycle, switching, and the engines by name.

One model is resident at a time. A request for another model switches:

    IDLE -> UNLOADING (waits for the running request, up to
            GRACEFUL_UNLOAD_TIMEOUT, then halts it) -> LOADING -> IDLE

From the moment a switch begins, every new request is refused with
503 model_busy (OAI-ERR-26). Before a switch begins, the new model is
checked: an unsupported quantization (400) or a model that cannot fit
(503 insufficient_memory) is refused with the resident model untouched
(OAI-ERR-20). A load that fails after the unload is 500
model_load_failed (OAI-ERR-32). Engines are found in a table keyed by
engine name, never by `if` on model family.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal, TypeVar

from ..engines.base import Capability, Engine, EngineId, LoadOptions
from ..engines.capabilities import ENCODER as ENCODER_CAPABILITIES
from ..engines.llamacpp import CAPABILITIES as LLAMACPP_CAPABILITIES
from ..engines.llamacpp import load_llamacpp_engine
from ..engines.rows import AUTO as AUTO_ROWS
from ..errors import ApiError
from ..settings import Settings
from .lock import ModelLock
from .memory import available_mib, cache_mib, needed_mib, rows_fit
from .registry import ModelEntry, ModelRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")
Loader = Callable[[ModelEntry, Settings, LoadOptions], Engine]
SUPPORTED_HF_QUANTIZATION: frozenset[str | None] = frozenset({None})


def _load_transformers(entry: ModelEntry, settings: Settings, options: LoadOptions) -> Engine:
    # transformers is imported on the first load (or question) that needs it: a server of a
    # GGUF, the default, starts seconds sooner without it
    from ..engines.transformers import load_transformers_engine
    from ..engines.transformers.float32 import Float32Settings

    return load_transformers_engine(
        entry.path,
        model_id=entry.model_id,
        cache_dir=settings.cache_dir,
        options=options,
        owned_by=entry.owned_by,
        encoder=entry.task == "embed",
        float32=Float32Settings(
            device=settings.scoring_float32_device,
            headroom_mib=settings.scoring_float32_headroom_mb,
            available_mib=lambda: available_mib(settings.memory_budget_mb),
        ),
    )


def _load_llamacpp(entry: ModelEntry, settings: Settings, options: LoadOptions) -> Engine:
    return load_llamacpp_engine(
        entry.path,
        model_id=entry.model_id,
        options=options,
        owned_by=entry.owned_by,
        embeddings=settings.gguf_enable_embeddings,
    )


@functools.cache
def _transformers_capabilities() -> frozenset[Capability]:
    from ..engines.transformers.engine import CAPABILITIES

    return CAPABILITIES


@dataclass(frozen=True, slots=True)
class EngineKind:
    load: Loader
    capabilities: Callable[[], frozenset[Capability]]  # read off the engine's class, once


ENGINE_KINDS: dict[EngineId, EngineKind] = {
    EngineId.TRANSFORMERS: EngineKind(_load_transformers, _transformers_capabilities),
    EngineId.LLAMACPP: EngineKind(_load_llamacpp, lambda: LLAMACPP_CAPABILITIES),
}
"""How each engine loads a model, and what a model it loads can do."""


class Phase(StrEnum):
    """Where a model switch stands: none runs (IDLE), or which half runs."""

    IDLE = "IDLE"
    UNLOADING = "UNLOADING"
    LOADING = "LOADING"


ModelState = Literal["READY", "LOADED", "LOADING", "UNLOADING", "FAILED"]
"""A model's state as `/v1/models` shows it."""

SessionState = Literal["empty", "loading", "ready", "error"]
"""The session's state as `/api/info` shows it."""


@dataclass(frozen=True, slots=True)
class Resident:
    """The model in memory: its registry entry and the engine that serves it."""

    entry: ModelEntry
    engine: Engine


class ModelManager:
    def __init__(
        self,
        registry: ModelRegistry,
        settings: Settings,
        executor: Executor,
        *,
        lock: ModelLock | None = None,
        load_options: Callable[[], LoadOptions] | None = None,
    ) -> None:
        """`lock`: the model lock for steering work (lock.py). `load_options`: how the next
        load goes (the config's session parameters; by default the launch's threads)."""
        self.registry = registry
        self._settings = settings
        self._executor = executor
        self._resident: Resident | None = None
        self._phase = Phase.IDLE
        self._target: ModelEntry | None = None
        self._failed: set[str] = set()
        self._tokenizer_lock = threading.Lock()
        self._error = ""  # why the last load failed ("" after a success or an unload)
        self.load_seconds = 0.0
        self.on_change: Callable[[], None] | None = None  # the session state moved (events)
        self.load_options: Callable[[], LoadOptions] = load_options or (
            lambda: LoadOptions(threads=settings.threads)
        )
        self.loaded_options = LoadOptions()  # what the resident model was loaded with
        self.lock = lock

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def session_state(self) -> tuple[SessionState, str]:
        """`empty`, `loading`, `ready` or `error` (LOC-INFO-06), and the error's words."""
        if self.switching:
            return "loading", ""
        if self._resident is not None:
            return "ready", ""
        return ("error", self._error) if self._error else ("empty", "")

    @property
    def resident(self) -> Resident | None:
        return self._resident

    @property
    def switching(self) -> bool:
        return self._phase != Phase.IDLE

    def entry(self, model_id: str) -> ModelEntry:
        """The registry entry for `model_id` (404 / 400 AMBIGUOUS_MODEL_NAME otherwise)."""
        return self.registry.entry(model_id)

    def capabilities(self, entry: ModelEntry) -> frozenset[Capability]:
        if entry.task == "embed":
            return ENCODER_CAPABILITIES
        return ENGINE_KINDS[entry.engine].capabilities()

    def state(self, entry: ModelEntry) -> ModelState:
        """READY, LOADED, LOADING, UNLOADING or FAILED."""
        if self._resident is not None and self._resident.entry == entry:
            return "UNLOADING" if self._phase == Phase.UNLOADING else "LOADED"
        if self._target == entry and self._phase == Phase.LOADING:
            return "LOADING"
        return "FAILED" if entry.model_id in self._failed else "READY"

    def engine_if_resident(self, entry: ModelEntry) -> Engine | None:
        if self._resident is not None and self._resident.entry == entry and not self.switching:
            return self._resident.engine
        return None

    def batch_rows(self) -> int:
        """How many rows the resident engine decodes together (1: serial, or none resident)."""
        batch = None if self._resident is None else self._resident.engine.batch
        return 1 if batch is None else batch.capacity

    def refuse_if_busy(self) -> None:
        """503 model_busy while a switch (unload or load) runs."""
        if self.switching:
            doing = "an unload" if self._phase == Phase.UNLOADING else "a model load"
            raise ApiError(
                "model_busy",
                f"The server is busy with {doing}; retry once it finishes.",
                "model",
                headers={"Retry-After": str(self._settings.queue_retry_after)},
            )

    def check_lock(self, entry: ModelEntry) -> None:
        """409 model_locked for any model but the one the server is locked to."""
        if self.lock is not None:
            self.lock.check(entry.model_id)

    def check_loadable(self, entry: ModelEntry) -> None:
        """Refusals that leave the resident model in place: quantization, memory."""
        if self.engine_if_resident(entry) is not None:
            return
        if (
            entry.engine == EngineId.TRANSFORMERS
            and entry.quantization not in SUPPORTED_HF_QUANTIZATION
            and entry.path.is_dir()
        ):
            raise ApiError(
                "unsupported_quantization",
                f"`{entry.model_id}` is quantized with `{entry.quantization}`, which the "
                "transformers engine cannot load here.",
                "model",
            )
        need = needed_mib(entry)
        freed = needed_mib(self._resident.entry) if self._resident is not None else 0
        free = available_mib(self._settings.memory_budget_mb)
        if need > free + freed:
            resident = self._resident.entry.model_id if self._resident else "nothing"
            raise ApiError(
                "insufficient_memory",
                f"`{entry.model_id}` needs about {need} MiB; {free + freed} MiB could be had "
                f"(host: {free} MiB available, plus {freed} MiB from unloading {resident}). "
                "Nothing was unloaded.",
                "model",
            )

    def begin_switch(self, entry: ModelEntry) -> None:
        """Mark a switch to `entry` as started: from now on new requests get model_busy."""
        self._phase, self._target = Phase.UNLOADING, entry

    def abort_switch(self, entry: ModelEntry) -> None:
        """Undo `begin_switch` when the switching request gave up before unloading anything."""
        if self._phase == Phase.UNLOADING and self._target == entry:
            self._phase, self._target = Phase.IDLE, None

    async def ensure(self, entry: ModelEntry) -> Engine:
        """The engine for `entry`, unloading another and loading it first. Call under the slot."""
        if self._resident is not None and self._resident.entry == entry:
            self._phase, self._target = Phase.IDLE, None
            return self._resident.engine
        loop = asyncio.get_running_loop()
        self._phase, self._target = Phase.UNLOADING, entry
        self._changed()
        try:
            if self._resident is not None:
                old = self._resident.engine
                self._resident = None
                await loop.run_in_executor(self._executor, old.close)
            self._phase = Phase.LOADING
            started = time.perf_counter()
            engine = await self._load(entry)
            self.load_seconds = time.perf_counter() - started
            self._resident = Resident(entry, engine)
        finally:
            self._phase, self._target = Phase.IDLE, None
            self._changed()
        return engine

    async def unload(self) -> bool:
        """Close the resident model (LOC-UNLOAD-02); call under the slot. False: none was."""
        if self._resident is None:
            return False
        old = self._resident.engine
        self._resident, self._error = None, ""
        await asyncio.get_running_loop().run_in_executor(self._executor, old.close)
        self._changed()
        return True

    async def _load(self, entry: ModelEntry) -> Engine:
        loop = asyncio.get_running_loop()
        load = ENGINE_KINDS[entry.engine].load
        options = self.load_options()
        if options.cache_ram < 0:  # auto: half what the model leaves, at most the default
            options = replace(options, cache_ram=cache_mib(entry, self._settings.memory_budget_mb))
        if options.parallel == AUTO_ROWS and not rows_fit(entry, self._settings.memory_budget_mb):
            log.warning(
                "%s loads serial: its rows' KV cache would not fit in memory", entry.model_id
            )
            options = replace(options, parallel=1)
        try:
            engine = await loop.run_in_executor(
                self._executor, load, entry, self._settings, options
            )
        except Exception as exc:
            self._failed.add(entry.model_id)
            self._error = f"loading {entry.model_id} failed: {exc}"
            log.exception("loading %s failed", entry.model_id)
            raise ApiError(
                "model_load_failed", f"Loading `{entry.model_id}` failed: {exc}", "model"
            ) from exc
        self._failed.discard(entry.model_id)
        self._error = ""
        self.loaded_options = options
        return engine

    async def with_tokenizer(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run `fn`, which uses the engine's tokenizer or vocabulary (tokenizing, rendering,
        compiling a grammar), off the event loop, one at a time. A call the caller knows to
        be short (`inline`: a few KB of text, well under a millisecond) runs on the loop
        when no other holds the tokenizer: a hop to a thread and back costs more than it."""
        if inline and self._tokenizer_lock.acquire(blocking=False):
            try:
                return fn()
            finally:
                self._tokenizer_lock.release()

        def locked() -> T:
            with self._tokenizer_lock:
                return fn()

        return await asyncio.to_thread(locked)

    def close(self) -> None:
        if self._resident is not None:
            self._resident.engine.close()
            self._resident = None


def listed(manager: ModelManager, entries: Sequence[ModelEntry]) -> list[dict[str, object]]:
    """The OpenAI `/v1/models` entries, with their state (OAI-MODELS-03); only the locked
    model while the server is locked (OAI-MODELS-05)."""
    shown = []
    for e in entries:
        if manager.lock is not None and not manager.lock.allows(e.model_id):
            continue
        state = manager.state(e)
        if state in {"READY", "LOADED", "LOADING"}:
            shown.append(
                {
                    "id": e.model_id,
                    "object": "model",
                    "created": e.created,
                    "owned_by": e.owned_by,
                    "state": state,
                }
            )
    return shown
