"""One completion request's steering: resolved as it comes in, again once it holds the slot,
and read back after generation for its headers.

The first resolution runs the refusals and gives the echo of a dialled
intensity before any load (steering/request.py). The second, once the slot
is held, makes the `RequestSource` the hooks read: the state may have moved
while the request waited. The headers state what the hooks applied, read
after generation (OAI-HDR-02); a state that cannot be read is `unknown`,
never omitted or guessed (OAI-GRAM-07).
"""

from __future__ import annotations

import logging

from ...engines.base import Capability, Engine
from ...models.manager import ModelManager
from ...models.registry import ModelEntry
from ...steering.header import Unknown, serialize
from ...steering.live import LiveSteering
from ...steering.request import Resolution, SteeringAsk, resolve_steering
from ...steering.source import RequestSource

log = logging.getLogger(__name__)


def resolution(
    ask: SteeringAsk,
    live: LiveSteering,
    manager: ModelManager,
    entry: ModelEntry,
    capabilities: frozenset[Capability],
) -> Resolution:
    """The request's steering against the live state; its refusals come before any load."""
    if Capability.STEERING not in capabilities:
        return Resolution(None)  # the policy refused the steering fields already
    resident = manager.engine_if_resident(entry) is not None
    return resolve_steering(ask, live, entry.model_id, resident)


def source(
    ask: SteeringAsk, live: LiveSteering, model_id: str, engine: Engine
) -> RequestSource | None:
    """What the hooks read, resolved again now that the slot is held; None on an engine
    that cannot steer."""
    if Capability.STEERING not in engine.capabilities:
        return None
    resolved = resolve_steering(ask, live, model_id, True)
    return RequestSource(live, model_id, resolved.override)


def header(steering: RequestSource | None) -> str:
    """X-miLLM-Steering, read after generation from what the hooks applied (OAI-HDR-02)."""
    if steering is None:
        return "none"
    try:
        return steering.header()
    except Exception:
        log.exception("reading the applied steering state failed")
        return serialize([Unknown("read_failed")])


def rung(steering: RequestSource | None) -> str | None:
    """X-miLLM-Circuit-Rung for what the hooks applied (None: omitted, OAI-RUNG-09..17)."""
    if steering is None:
        return None
    try:
        return steering.rung()
    except Exception:  # an unreadable state claims no evidence (OAI-RUNG-11)
        log.exception("reading the applied circuits failed")
        return None


def origin(ask: SteeringAsk, statement: str, rung: str | None) -> str | None:
    """Where a generation's steering came from, for the metrics, read off its X-miLLM-Steering
    `statement` and circuit `rung` (`header`, `rung`): `inline`, `profile`, `circuit` (a
    circuit's rung applied) or `operator` (the live state); None when nothing steered it."""
    if statement == "none":
        return None
    if ask.inline is not None:
        return "inline"
    if ask.profile is not None:
        return "profile"
    return "circuit" if rung is not None else "operator"
