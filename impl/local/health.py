"""Health: `GET /api/health/inference`, which backend serves generations now (OAI-CBM-14);
`GET /v1/health/ready`, whether a model serves (issue 47); the metrics' gauges (`live`).

`continuous_batching` while the resident engine has a batch (it was loaded
with `parallel` above 1 on an engine that batches, docs/LOCAL.md), else
`serial`. The slot's occupancy is the scheduler's (impl/serving/scheduler.py);
`prompt_cache`, what the resident engine's prompt cache holds and has served
(engines/prompt_cache.py), null when it keeps none.
"""

from __future__ import annotations

from typing import Any

from ..metrics import Live, Metrics
from ..models.manager import ModelManager
from ..serving.scheduler import Scheduler


def inference(manager: ModelManager, scheduler: Scheduler) -> dict[str, Any]:
    """The backend, its rows, and who holds or waits for the slot now."""
    resident = manager.resident
    batch = None if resident is None else resident.engine.batch
    cache = None if resident is None else resident.engine.prompt_cache
    return {
        "backend": "serial" if batch is None else "continuous_batching",
        "parallel": 1 if batch is None else batch.capacity,
        "slots_in_use": scheduler.in_use,
        "queue_length": scheduler.waiting,
        "model": None if resident is None else resident.entry.model_id,
        "device": None if resident is None else resident.engine.facts.device,
        "prompt_cache": None if cache is None else cache.stats(),
    }


def readiness(manager: ModelManager) -> tuple[int, dict[str, Any]]:
    """`GET /v1/health/ready`: 200 while a model is loaded and no load runs, else 503; the
    state (LOC-INFO-06's words), the model, the last load's error."""
    state, error = manager.session_state()
    resident = manager.resident
    model = None if resident is None or state != "ready" else resident.entry.model_id
    return (200 if state == "ready" else 503), {"status": state, "model": model, "error": error}


def live(manager: ModelManager, scheduler: Scheduler, metrics: Metrics) -> Live:
    """What runs now, for the metrics' gauges: the resident model, the scheduler's holders and
    waiters, the KV tokens running choices hold over the engine's capacity (its rows times a
    row's window, or its one context)."""
    resident = manager.resident
    if resident is None:
        return Live(None, scheduler.in_use, scheduler.waiting, 0, 0)
    engine = resident.engine
    batch = engine.batch
    capacity = engine.facts.context_length if batch is None else batch.capacity * batch.window
    return Live(
        resident.entry.model_id, scheduler.in_use, scheduler.waiting, metrics.kv_used, capacity
    )
