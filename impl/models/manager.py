"""The resident model: loading, switching and the engines by name.

One model is resident at a time. `ensure()` runs under the generation slot,
so a switch never happens while another request generates. Engines are
found in a registry keyed by engine name, never by `if` on model family.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TypeVar

from ..engines.base import Engine
from ..engines.transformers import load_transformers_engine
from ..engines.transformers.engine import CAPABILITIES as TRANSFORMERS_CAPABILITIES
from ..http.errors import ApiError
from ..settings import Settings
from .registry import ModelEntry, ModelRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")
Loader = Callable[[ModelEntry, Settings], Engine]


def _load_transformers(entry: ModelEntry, settings: Settings) -> Engine:
    return load_transformers_engine(
        entry.path,
        model_id=entry.model_id,
        cache_dir=settings.cache_dir,
        threads=settings.torch_threads,
        owned_by=entry.owned_by,
    )


LOADERS: dict[str, Loader] = {"transformers": _load_transformers}
CAPABILITIES: dict[str, frozenset[str]] = {"transformers": TRANSFORMERS_CAPABILITIES}


class ModelManager:
    def __init__(self, registry: ModelRegistry, settings: Settings, executor: Executor) -> None:
        self.registry = registry
        self._settings = settings
        self._executor = executor
        self._resident: tuple[ModelEntry, Engine] | None = None
        self._tokenizer_lock = threading.Lock()

    @property
    def resident(self) -> tuple[ModelEntry, Engine] | None:
        return self._resident

    def entry(self, model_id: str) -> ModelEntry:
        """The registry entry for `model_id`; 404 model_not_found otherwise."""
        found = self.registry.get(model_id)
        if found is None:
            known = ", ".join(e.model_id for e in self.registry.entries()) or "none"
            raise ApiError(
                "model_not_found",
                f"The model `{model_id}` does not exist. Available: {known}.",
                "model",
            )
        return found

    def capabilities(self, entry: ModelEntry) -> frozenset[str]:
        return CAPABILITIES[entry.engine]

    def engine_if_resident(self, entry: ModelEntry) -> Engine | None:
        if self._resident is not None and self._resident[0] == entry:
            return self._resident[1]
        return None

    async def ensure(self, entry: ModelEntry) -> Engine:
        """The engine for `entry`, loading it (and unloading another) first. Call under the slot."""
        engine = self.engine_if_resident(entry)
        if engine is not None:
            return engine
        loop = asyncio.get_running_loop()
        if self._resident is not None:
            old = self._resident[1]
            self._resident = None
            await loop.run_in_executor(self._executor, old.close)
        try:
            engine = await loop.run_in_executor(
                self._executor, LOADERS[entry.engine], entry, self._settings
            )
        except Exception as exc:
            log.exception("loading %s failed", entry.model_id)
            raise ApiError(
                "model_load_failed", f"Loading `{entry.model_id}` failed: {exc}", "model"
            ) from exc
        self._resident = (entry, engine)
        return engine

    async def tokenize(self, fn: Callable[[], T]) -> T:
        """Run a tokenizer call off the event loop, one at a time."""

        def locked() -> T:
            with self._tokenizer_lock:
                return fn()

        return await asyncio.to_thread(locked)

    def close(self) -> None:
        if self._resident is not None:
            self._resident[1].close()
            self._resident = None


def listed(entries: Sequence[ModelEntry]) -> list[dict[str, object]]:
    """The OpenAI `/v1/models` entries."""
    return [
        {"id": e.model_id, "object": "model", "created": e.created, "owned_by": e.owned_by}
        for e in entries
    ]
