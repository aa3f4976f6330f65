"""`GET /api/health/inference`: which backend serves generations now (OAI-CBM-14).

`continuous_batching` while the resident engine has a batch (it was loaded
with `parallel` above 1 on an engine that batches, docs/LOCAL.md), else
`serial`. The slot's occupancy is the scheduler's (impl/serving/scheduler.py);
`prompt_cache`, what the resident engine's prompt cache holds and has served
(engines/prompt_cache.py), null when it keeps none.
"""

from __future__ import annotations

from typing import Any

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
        "prompt_cache": None if cache is None else cache.stats(),
    }
