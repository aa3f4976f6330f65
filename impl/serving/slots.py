"""Holding the generation slot with a given model resident (shared by every model route)."""

from __future__ import annotations

from ..engines.base import Engine
from ..models.manager import ModelManager
from ..models.registry import ModelEntry
from ..settings import Settings
from .scheduler import Scheduler, Ticket


async def slot_with_model(
    manager: ModelManager, scheduler: Scheduler, settings: Settings, entry: ModelEntry
) -> tuple[Ticket, Engine]:
    """Hold the slot with `entry` resident, switching models first if needed.

    A switch is checked (quantization, memory) before it begins, goes ahead
    of the queue, and waits for the running request up to
    GRACEFUL_UNLOAD_TIMEOUT before halting it. The caller leaves the ticket.
    """
    switch = manager.engine_if_resident(entry) is None
    if switch:
        manager.check_loadable(entry)
    ticket = scheduler.enter(front=switch)
    try:
        if switch:
            manager.begin_switch(entry)
            if not await scheduler.wait(ticket, settings.graceful_unload_timeout):
                scheduler.halt_holder()
        await scheduler.wait(ticket)
        engine = await manager.ensure(entry)
    except BaseException:
        manager.abort_switch(entry)
        scheduler.leave(ticket)
        raise
    return ticket, engine
