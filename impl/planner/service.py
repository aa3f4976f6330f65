"""`GET /api/plan` and `POST /api/plan/apply` (REQ-003 PLAN-02..08, -46..54, APPLY,
EVENTS-22..24, SEC-68/69).

A measurement runs the probes in a worker thread, one at a time, never while
a generation or a load runs (409 `busy`: it would skew the figures, and loads
and measurements are serialised). Each stage it enters is a `plan_progress`
event (`step`, `label`, `index`, `count`), and it ends with `{"step":
"done"}`. The server keeps the last plan it made (`?cached=1` answers it
without measuring) and, once the model it was made for has answered a whole
turn, sets that turn's decode rate beside the prediction (`measured`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ApiError
from ..events import EventBus
from ..local.config import ConfigService
from ..local.session import Session
from ..models.manager import ModelManager
from ..models.registry import ModelEntry
from . import devices as devices_mod
from . import machine as machine_mod
from . import shape as shape_mod
from .proposal import Subject, propose
from .rules import Facts

log = logging.getLogger(__name__)

STEPS = {  # plan_progress steps in order, and their words (LOC-EVENTS-22/23)
    "devices": "Asking for devices beyond the host",
    "model": "Reading the model's header",
    "compute": "Timing the engine's kernels on this model's matrices",
    "storage": "Reading the model file",
    "memory": "Reading the memory available",
    "placement": "Placing the layers",
    "rules": "Deciding the settings",
}


class Planner:
    def __init__(
        self,
        *,
        bus: EventBus,
        config: ConfigService,
        manager: ModelManager,
        session: Session,
        models_dir: Path,
        isolated: bool = True,
        host: machine_mod.Host | None = None,
        device_probe: Callable[[bool], devices_mod.Devices] | None = None,
    ) -> None:
        self._bus = bus
        self._config = config
        self._manager = manager
        self._session = session
        self._models_dir = models_dir
        self._isolated = isolated
        self._host = host or machine_mod.Host(isolated=isolated)
        self._device_probe = device_probe or (lambda isolated: devices_mod.probe(isolated=isolated))
        self.measuring = False
        self.last: dict[str, Any] | None = None  # the last plan made
        self._load_plan: dict[str, Any] | None = None  # the last auto load's
        self._turn: dict[str, Any] | None = None  # the resident model's last whole turn
        self._turn_engine: int | None = None
        bus.tap("done", self._done)

    def refuse_if_measuring(self) -> None:
        """409 busy while a measurement runs: loads and measurements are serialised
        (LOC-SEC-68)."""
        if self.measuring:
            raise ApiError("busy", "A plan measurement is under way; load once it ends.")

    # -- GET /api/plan -----------------------------------------------------------------

    async def get(self, *, cached: bool = False, measure: bool = False) -> dict[str, Any]:
        if cached:
            if self.last is None:
                return {"available": True, "none": True}
            return self._with_turn(self.last) | {"cached": True}
        load_plan = self._resident_load_plan()
        if load_plan is not None and not measure:  # LOC-PLAN-46: no measurement
            return self._with_turn(load_plan) | {"from_last_load": True}
        return await self.measure()

    # -- auto loads (LOC-LOAD-09..11) ------------------------------------------------

    async def plan_for_load(self, target: ModelEntry) -> None:
        """Before an auto load: unload the session, measure with nothing loaded (`state:
        planning`), apply the plan. The load starts after; its plan is the one GET
        /api/plan answers while that model is loaded (`from_last_load`)."""
        self._session.planning = True  # from here a second load is 409 busy
        self._session.announce()
        try:
            await self._session.unload()
            proposal = await self._run(target)
        finally:
            self._session.planning = False
            self._session.announce()
        if "values" in proposal:
            self.apply()
            self._load_plan = proposal
        else:
            log.warning("auto plan for %s: %s", target.model_id, proposal.get("error"))

    def loaded_held(self) -> int:
        """What the resident model's load plan charged in its ledger; 0 for a model loaded
        without a plan (LOC-HFI-22)."""
        plan = self._resident_load_plan()
        return 0 if plan is None else int(plan["memory"]["pools"][0]["held_bytes"])

    def _resident_load_plan(self) -> dict[str, Any] | None:
        resident, plan = self._manager.resident, self._load_plan
        if resident is None or plan is None or resident.entry.model_id != plan["model"]:
            return None
        return plan

    async def measure(self, target: ModelEntry | None = None) -> dict[str, Any]:
        """Measure the machine and plan `target` (the configured model when None); 409
        while a generation, a load or another measurement runs."""
        if self._session.generating:
            raise ApiError(
                "busy",
                "A generation is running: it would skew the measurement. Plan once it ends.",
            )
        self._session.refuse_if_loading()
        return await self._run(target)

    async def _run(self, target: ModelEntry | None) -> dict[str, Any]:
        """One measurement of `target` (the configured model when None), one at a time."""
        if target is not None:
            subject: Subject | None = Subject(model_id=target.model_id, engine=target.engine)
            path = str(target.path)
        else:
            subject, path = self._subject()
        if subject is None:
            return {"available": True, "error": path}
        if self.measuring:  # checked and set with no await between: one loop, no race
            raise ApiError("busy", "A plan measurement is already under way.")
        self.measuring = True
        try:
            resident = self._manager.resident
            loaded = "" if resident is None else resident.entry.model_id
            proposal = await asyncio.to_thread(self._measure, subject, Path(path), loaded)
        finally:
            self.measuring = False
        self.last = proposal
        return self._with_turn(proposal)

    def _subject(self) -> tuple[Subject | None, str]:
        """The configured model to plan, or None and why there is nothing to plan."""
        values = self._config.base_values
        model = str(values["model"])
        if not model:
            return None, "No model is configured: set `model`, then plan."
        try:
            entry = self._session.locator.find(model, peer_local=True, engine=str(values["engine"]))
        except ApiError as exc:
            return None, exc.message
        return Subject(model_id=entry.model_id, engine=entry.engine), str(entry.path)

    def _measure(self, subject: Subject, path: Path, loaded: str) -> dict[str, Any]:
        steps = list(STEPS)

        def step(name: str) -> None:
            self._bus.publish(
                "plan_progress",
                {
                    "step": name,
                    "label": STEPS[name],
                    "index": steps.index(name),
                    "count": len(steps),
                },
            )

        try:
            step("devices")
            found = self._device_probe(self._isolated)
            step("model")
            shape = shape_mod.read(path, subject.engine)
            base = self._config.base_values
            pinned = self._config.user_keys | frozenset(self._config.operator_keys)
            dtype = str(base["dtype"]) if "dtype" in pinned else "auto"
            measured = machine_mod.measure(
                self._host,
                model_path=path,
                models_dir=self._models_dir,
                ask=lambda threads: shape.ask(threads, dtype),
                step=step,
            )
            step("placement")
            step("rules")
            facts = Facts(
                shape=shape,
                machine=measured,
                base=base,
                user_keys=pinned,
                gpu=bool(found.usable),
                card=max(
                    (d for d in found.usable if d.name.startswith("cuda")),
                    key=lambda d: d.memory_total,
                    default=None,
                ),
            )
            return propose(subject, facts, found, loaded=loaded)
        except shape_mod.ShapeError as exc:
            return {"available": True, "error": str(exc)}
        finally:
            self._bus.publish("plan_progress", {"step": "done"})

    # -- POST /api/plan/apply ----------------------------------------------------------

    def apply(self) -> dict[str, Any]:
        """The current plan's values become the config's plan layer (LOC-APPLY-01..08)."""
        plan = self.last
        if plan is None or "values" not in plan:
            raise ApiError("no_plan", "There is no plan to apply: GET /api/plan makes one.")
        decisions = [d for d in plan["decisions"] if d["group"] != "notes"]
        return self._config.apply_plan(plan["model"], plan["values"], decisions)

    # -- measured (LOC-PLAN-47/48) -----------------------------------------------------

    def _done(self, data: dict[str, Any]) -> None:
        """A generation's `done` event: a whole turn's decode rate, for `measured`."""
        if data.get("cancelled") or not data.get("tok_s") or int(data.get("tokens", 0)) < 2:
            return
        resident = self._manager.resident
        self._turn_engine = None if resident is None else id(resident.engine)
        self._turn = {
            "model": "" if resident is None else resident.entry.model_id,
            "s_per_token": round(1.0 / float(data["tok_s"]), 6),
            "cache_hit_pct": -1,
            "tokens": int(data["tokens"]),
        }

    def _with_turn(self, plan: dict[str, Any]) -> dict[str, Any]:
        """`plan` with `measured` from the last whole turn of the model it was made for,
        while that model is resident."""
        turn, resident = self._turn, self._manager.resident
        if (
            turn is None
            or resident is None
            or id(resident.engine) != self._turn_engine
            or turn["model"] != plan.get("model")
        ):
            return plan
        return plan | {"measured": {k: v for k, v in turn.items() if k != "model"}}
