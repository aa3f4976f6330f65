"""The config: parameter values over the server's defaults, persisted (LOC-CONFIG).

Layers: the table's defaults < the launch flags (the settings' `--model`,
`--threads`, `--default-max-tokens`, `--data-dir`, and every other row's own
flag, e.g. `--temp`) < the last applied plan (`POST /api/plan/apply`) < the
values the user set. Only the user's values and the plan are saved, so a key
in neither follows the current default after an upgrade (LOC-CONC-12).
`settings.json` in the data directory is `{"values": {user-set keys},
"user_keys": [...], "plan": {model, values, decisions} | null}`, with
`"auto_plan"` once the person set it, replaced atomically (temp file, fsync,
rename) so a crash never leaves half a file; a missing or unreadable one
starts from the defaults.

A plan is made from the config without its own layer (`base_values`,
LOC-APPLY-05) and replaces the previous plan whole (LOC-APPLY-06); it never
touches a user key (LOC-APPLY-02, -07). `auto_plan` starts as the launch's
(`--auto-plan`, off by default: docs/DECISIONS.md, contract 0.15.0) and, once
the person sets it, is theirs: saved, and restored after a restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..engines.base import LoadOptions
from ..engines.llamacpp.loading import gpu_offload
from ..errors import ApiError
from ..models.locator import ModelLocator
from ..models.manager import ModelManager
from ..serving.completions.defaults import N_PREDICT_CAP, RequestDefaults
from ..settings import Settings
from ..store.documents import Document
from .params import AUTO, Param, Refused, by_key, table

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
CONFIG_KEY = "config"  # its row in the database, where the server has a PostgreSQL DSN
RANDOM_SEED = 4294967295  # the `seed` parameter's "random per run"


class Publisher(Protocol):
    def publish(self, name: str, data: dict[str, Any]) -> None: ...


def _launch(
    settings: Settings, launch_id: str | None, flags: Mapping[str, Any] | None = None
) -> dict[str, tuple[Any, bool]]:
    """Each launch setting's parameter value, and whether the operator gave it (a setting
    that differs from its built-in default came from its flag or environment variable);
    `flags` are the rows' own flags as given (params.launch_values), all the operator's."""
    built_in = Settings()
    given = {key: (value, True) for key, value in (flags or {}).items()}
    return given | {
        "model": (launch_id or settings.model or "", settings.model is not None),
        "threads": (settings.threads or AUTO, settings.threads != built_in.threads),
        "n-predict": (
            settings.default_max_tokens,
            settings.default_max_tokens != built_in.default_max_tokens,
        ),
        "data-dir": (str(settings.data_dir), settings.data_dir != built_in.data_dir),
    }


def operator_keys(
    settings: Settings, launch_id: str | None, flags: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """The parameters the operator set at launch (docs/DECISIONS.md, config layers)."""
    launch = _launch(settings, launch_id, flags)
    return tuple(key for key, (_, given) in launch.items() if given)


def server_defaults(
    settings: Settings, launch_id: str | None, flags: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The table's defaults with the launch settings laid over them (LOC-PARAMS-03):
    default < launch flags < the user's values (docs/DECISIONS.md)."""
    defaults = {param.key: param.default for param in table()}
    rows = by_key()
    for key, (value, _) in _launch(settings, launch_id, flags).items():
        try:
            defaults[key] = rows[key].parse(value)
        except Refused as exc:
            log.warning("launch setting for %s ignored: %s", key, exc)
    return defaults


class ConfigService:
    """GET and PUT /api/config: values, user keys, validation, persistence, events."""

    def __init__(
        self,
        defaults: Mapping[str, Any],
        document: Document,
        bus: Publisher,
        manager: ModelManager | None = None,
        *,
        locator: ModelLocator | None = None,
    ) -> None:
        self._defaults = dict(defaults)
        self._document = document
        self._bus = bus
        self._manager = manager
        self._locator = locator
        self.operator_keys: tuple[str, ...] = ()  # set at launch, shown, never persisted
        self._user: dict[str, Any] = {}
        self._plan: dict[str, Any] | None = None
        self.auto_plan_default = False  # the launch's (`--auto-plan`)
        self._auto_plan: bool | None = None  # the person's choice, once made
        self._restore()
        self._loaded_token: int | None = None
        self._loaded_values: dict[str, Any] | None = None  # session values at the last load
        if manager is not None:
            self._follow(manager)

    @classmethod
    def open(
        cls,
        settings: Settings,
        bus: Publisher,
        launch_id: str | None,
        manager: ModelManager,
        *,
        locator: ModelLocator,
        document: Document,
        flags: Mapping[str, Any] | None = None,
    ) -> ConfigService:
        """`flags`: the rows' own launch flags as given (params.launch_values); `document`:
        where the config is kept (`settings.json` in the data dir, or the database's row
        when the server has a PostgreSQL DSN: app.py)."""
        defaults = server_defaults(settings, launch_id, flags)
        service = cls(defaults, document, bus, manager, locator=locator)
        service.operator_keys = operator_keys(settings, launch_id, flags)
        service.auto_plan_default = settings.auto_plan
        return service

    # -- reading -------------------------------------------------------------------

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter, in table order (LOC-CONFIG-02)."""
        planned = self._plan["values"] if self._plan is not None else {}
        return {
            p.key: self._user.get(p.key, planned.get(p.key, self._defaults[p.key])) for p in table()
        }

    @property
    def base_values(self) -> dict[str, Any]:
        """Every parameter without the plan layer: what a plan is made from (LOC-APPLY-05)."""
        return {p.key: self._user.get(p.key, self._defaults[p.key]) for p in table()}

    @property
    def user_keys(self) -> frozenset[str]:
        return frozenset(self._user)

    @property
    def auto_plan(self) -> bool:
        """Whether every load plans first (LOC-CONFIG-09, LOC-LOAD-09)."""
        return self.auto_plan_default if self._auto_plan is None else self._auto_plan

    @property
    def plan(self) -> dict[str, Any] | None:
        """The last applied plan: {model, values, decisions}, or None."""
        return self._plan

    def request_defaults(self) -> RequestDefaults:
        """What a generation request that leaves a field out gets (docs/LOCAL.md)."""
        return request_defaults(self.values)

    def load_options(self) -> LoadOptions:
        """How the next load goes: the session parameters (LOC-CONC-10; docs/LOCAL.md).

        On a build of llama-cpp-python without a GPU backend, `n-gpu-layers` other than 0
        is turned off for the load, with a warning (a `log` event with level `warn`,
        LOC-LOAD-12)."""
        values = self.values
        offload = int(values["n-gpu-layers"])
        if offload != 0 and not gpu_offload():
            log.warning(
                "n-gpu-layers %s turned off: this build of llama-cpp-python runs on the CPU, "
                "so the model loads with no layer offloaded (0)",
                offload,
            )
            offload = 0

        def count(key: str) -> int:
            return 0 if values[key] == AUTO else int(values[key])

        return LoadOptions(
            threads=count("threads"),
            ctx_size=count("ctx-size"),
            batch_size=count("batch-size"),
            dtype=str(values["dtype"]),
            device=str(values["device"]),
            n_gpu_layers=offload,
            mmap=bool(values["mmap"]),
            mlock=bool(values["mlock"]),
            parallel=count("parallel"),
            cache_ram=-1 if values["cache-ram"] == AUTO else int(values["cache-ram"]),
            prefill_chunk=-1 if values["prefill-chunk"] == AUTO else int(values["prefill-chunk"]),
        )

    def params(self) -> list[dict[str, Any]]:
        """GET /api/params: the table with the server's defaults (LOC-PARAMS-01)."""
        return [param.served(self._defaults[param.key]) for param in table()]

    def view(self) -> dict[str, Any]:
        """GET /api/config (LOC-CONFIG-01)."""
        self._observe()
        values = self.values
        error = self._validate(values)
        return {
            "values": values,
            "user_keys": [p.key for p in table() if p.key in self._user],
            "operator_keys": [p.key for p in table() if p.key in self.operator_keys],
            "args": launch_args(values),
            "valid": not error,
            "error": error,
            "reload_required": self._reload_required(values),
            "plan": self._plan,
            "auto_plan": self.auto_plan,
        }

    # -- changing ------------------------------------------------------------------

    def update(
        self,
        values: Mapping[str, Any] | None = None,
        reset: Sequence[str] = (),
        auto_plan: bool | None = None,
        *,
        peer_local: bool = True,
    ) -> dict[str, Any]:
        """PUT /api/config: set, reset, validate, save, announce (LOC-CONFIG-10).

        A `model` path this peer may not open is rejected, not stored (LOC-SEC-62)."""
        rejected: dict[str, str] = {}
        user = dict(self._user)
        for key, value in (values or {}).items():
            try:
                parsed = self._settable(key).parse(value)
                if key == "model":
                    self._confine(parsed, peer_local)
                user[key] = parsed
            except Refused as exc:
                rejected[key] = str(exc)
        for key in reset:
            try:
                self._settable(key)
            except Refused as exc:
                rejected[key] = str(exc)
                continue
            user.pop(key, None)
        choice = self._auto_plan if auto_plan is None else auto_plan
        changed = user != self._user or auto_plan is not None
        if changed:
            self._save(user, self._plan, choice)  # raises before anything changes on a refusal
            self._user = user
            self._auto_plan = choice
        view = self.view()
        if changed:
            self._bus.publish("config", view)
        return {**view, "rejected": rejected}

    def apply_plan(self, model: str, values: Mapping[str, Any], decisions: Any) -> dict[str, Any]:
        """POST /api/plan/apply: the plan's values become the plan layer, replacing the last
        plan whole; user keys are neither changed nor joined (LOC-APPLY-01..08)."""
        rows = by_key()
        parsed = {
            key: rows[key].parse(value)
            for key, value in values.items()
            if key in rows and not rows[key].writes_files
        }
        plan = {"model": model, "values": parsed, "decisions": decisions}
        self._save(self._user, plan, self._auto_plan)  # raises before anything changes
        self._plan = plan
        view = self.view()
        self._bus.publish("config", view)
        return view

    def _confine(self, model: str, peer_local: bool) -> None:
        if self._locator is None:
            return
        try:
            self._locator.check(model, peer_local=peer_local)
        except ApiError as exc:
            raise Refused(f"{exc.code}: {exc.message}") from exc

    def _settable(self, key: str) -> Param:
        param = by_key().get(key)
        if param is None:
            raise Refused("unknown parameter")
        if param.writes_files:
            raise Refused("launch only")
        return param

    # -- validation ----------------------------------------------------------------

    def _validate(self, values: Mapping[str, Any]) -> str:
        """Cross-field checks (LOC-CONFIG-05): "" when the config can be loaded."""
        model = values["model"]
        if not model:
            return "No model is set: set `model` to a path or a model id."
        if not self._knows(model):
            return f"`model` names no file and no model id: {model}"
        return ""

    def _knows(self, model: str) -> bool:
        if self._locator is None:
            return Path(model).expanduser().exists()
        return self._locator.known(model)

    # -- the loaded session (LOC-CONFIG-07) ---------------------------------------------

    def _follow(self, manager: ModelManager) -> None:
        previous = manager.on_change

        def changed() -> None:
            self._observe()
            if previous is not None:
                previous()

        manager.on_change = changed

    def _observe(self) -> None:
        """Remember the session values when a new session becomes resident."""
        resident = self._manager.resident if self._manager is not None else None
        token = None if resident is None else id(resident.engine)
        if token != self._loaded_token:
            self._loaded_token = token
            self._loaded_values = None if token is None else _session(self.values)

    def in_session(self, key: str) -> Any:
        """A session parameter as the loaded session has it (the current value when none is)."""
        self._observe()
        loaded = self._loaded_values
        return loaded[key] if loaded is not None else self.values[key]

    def _reload_required(self, values: Mapping[str, Any]) -> bool:
        return self._loaded_values is not None and self._loaded_values != _session(values)

    # -- persistence (LOC-CONFIG-19) -------------------------------------------------

    def _save(
        self, user: Mapping[str, Any], plan: dict[str, Any] | None, auto_plan: bool | None
    ) -> None:
        ordered = {p.key: user[p.key] for p in table() if p.key in user}
        document: dict[str, Any] = {"values": ordered, "user_keys": list(ordered), "plan": plan}
        if auto_plan is not None:  # only the person's choice is kept
            document["auto_plan"] = auto_plan
        self._document.write(json.dumps(document, indent=2) + "\n")

    def reload(self) -> None:
        """The stored values read again, where another process of a cluster changed them."""
        self._user, self._plan, self._auto_plan = {}, None, None
        self._restore()

    def _restore(self) -> None:
        try:
            text = self._document.read()
            if text is None:
                return
            document = json.loads(text)
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable, starting from the defaults: %s", self._document.name, exc)
            return
        stored = document.get("values") if isinstance(document, dict) else None
        if not isinstance(stored, dict):
            log.warning(
                "%s has no `values` object, starting from the defaults", self._document.name
            )
            return
        self._user = self._parsed(stored)
        choice = document.get("auto_plan")
        self._auto_plan = choice if isinstance(choice, bool) else None
        plan = document.get("plan")
        if isinstance(plan, dict) and isinstance(plan.get("values"), dict):
            self._plan = {
                "model": str(plan.get("model", "")),
                "values": self._parsed(plan["values"]),
                "decisions": plan.get("decisions", []),
            }

    def _parsed(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in stored.items():
            try:
                found[key] = self._settable(key).parse(value)
            except Refused as exc:
                log.warning("%s: %s dropped (%s)", self._document.name, key, exc)
        return found


def _session(values: Mapping[str, Any]) -> dict[str, Any]:
    return {p.key: values[p.key] for p in table() if p.scope == "session"}


def launch_args(values: Mapping[str, Any]) -> list[str]:
    """`miserver serve` flags that reproduce `values` (LOC-CONFIG-04)."""
    args: list[str] = []
    for param in table():
        value = values[param.key]
        if param.flag is None or value == "":
            continue
        if isinstance(value, bool):
            switch = param.switch(value)
            args += [] if switch is None else [switch]
        elif value == AUTO and param.type in ("int", "float"):
            args += [param.flag, param.flag_auto or AUTO]
        else:
            args += [param.flag, str(value)]
    return args


def request_defaults(values: Mapping[str, Any]) -> RequestDefaults:
    """The defaults the config `values` (GET /api/config's) give."""
    cap = by_key()["n-predict"].maximum
    seed = int(values["seed"])
    return RequestDefaults(
        max_tokens=int(values["n-predict"]),
        max_tokens_cap=int(cap) if cap is not None else N_PREDICT_CAP,
        temperature=float(values["temp"]),
        top_p=float(values["top-p"]),
        top_k=int(values["top-k"]),
        seed=None if seed == RANDOM_SEED else seed,
        think=bool(values["think"]),
    )
