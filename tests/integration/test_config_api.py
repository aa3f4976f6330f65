"""GET /api/params, GET and PUT /api/config over HTTP (LOC-PARAMS, LOC-CONFIG, LOC-CONC)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.rows import PREFILL_CHUNK, chunk_of
from miserver.local import config as config_mod
from miserver.local.config import CONFIG_KEY, SETTINGS_FILE, ConfigService
from miserver.local.params import table
from miserver.models.manager import ModelManager, Resident
from miserver.settings import Settings
from miserver.store.documents import FileDocument
from tests.conftest import JSON, MODEL_ID, LocalClient
from tests.postgres import PostgresServer

REQUIRED = {"key", "label", "type", "group", "group_label", "level", "scope", "help", "flag"}
OPTIONAL = {
    "short",
    "switches",
    "choices",
    "min",
    "max",
    "unit",
    "typical",
    "special",
    "lossy",
    "accepts_auto",
}


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


def put(client: TestClient, body: Any) -> dict[str, Any]:
    response = client.put("/api/config", json=body, headers=JSON)
    assert response.status_code == 200, response.text
    return cast(dict[str, Any], response.json())


def stored(settings: Settings) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((settings.data_dir / SETTINGS_FILE).read_text()))


# -- the table -------------------------------------------------------------------------


def test_the_table_has_its_shape(client: TestClient) -> None:
    """LOC-PARAMS-01, -04..-12, -16, -18, -19: one object per row, the required fields
    (a flag on every row), only the listed optional ones, the enumerated sets, contiguous
    groups."""
    response = client.get("/api/params")
    assert response.status_code == 200
    rows = response.json()
    assert isinstance(rows, list) and rows
    keys = [row["key"] for row in rows]
    assert len(keys) == len(set(keys))
    for row in rows:
        assert REQUIRED | {"default"} <= row.keys()
        assert row.keys() - REQUIRED - {"default"} <= OPTIONAL, row["key"]
        assert row["type"] in {"bool", "int", "float", "path", "text", "choice"}
        assert row["level"] in {"basic", "advanced", "experimental", "debug"}
        assert row["scope"] in {"request", "session"}
        assert row["flag"].startswith("--")  # every row has its flag (LOC-PARAMS-09)
        for switch in row.get("switches", []):  # LOC-PARAMS-11
            assert switch.keys() <= {"flag", "value", "deprecated"}
            assert switch["flag"].startswith("--") and type(switch["value"]) is bool
        for choice in row.get("choices", []):
            assert choice.keys() == {"value", "label"}
        for special in row.get("special", []):
            assert type(special["value"]) is {"int": int, "float": float}[row["type"]]
        if row["default"] == "auto" and row["type"] in ("int", "float"):
            assert row.get("accepts_auto") is True
        if row["type"] == "choice":
            assert row["default"] in [c["value"] for c in row["choices"]]
    groups = [row["group"] for row in rows]
    order = list(dict.fromkeys(groups))
    assert groups == sorted(groups, key=order.index), "the rows of a group are contiguous"


def test_the_table_has_the_rows_the_api_names(client: TestClient) -> None:
    """LOC-PARAMS-20, -21 (adapted), -03: the named rows, their types and scopes, the
    server defaults that turn things on."""
    rows = {row["key"]: row for row in client.get("/api/params").json()}
    assert rows["model"]["type"] == "path"
    assert rows["n-predict"]["type"] == "int" and rows["n-predict"]["scope"] == "request"
    assert "max" in rows["n-predict"]
    assert rows["think"]["type"] == "bool" and rows["think"]["scope"] == "request"
    assert rows["decide"]["type"] == "bool"
    for key in ("temp", "top-k", "top-p", "seed", "engine", "ctx-size", "threads"):
        assert key in rows
    for key in ("batch-size", "parallel", "n-gpu-layers", "dtype", "device", "mmap", "mlock"):
        assert key in rows
    assert "chat-template" not in rows  # chats always use the model's template
    assert rows["decide"]["default"] is True
    assert rows["ctx-size"]["default"] == "auto"
    assert {c["value"] for c in rows["engine"]["choices"]} == {"auto", "transformers", "llama.cpp"}
    assert rows["top-k"]["special"] == [{"value": 0, "label": "off"}]


def test_internal_fields_are_not_served(client: TestClient) -> None:
    """LOC-PARAMS-10: `writes_files` marks launch-only rows in the data, never on the wire."""
    assert any(param.writes_files for param in table())
    assert all("writes_files" not in row for row in client.get("/api/params").json())


# -- reading and setting -----------------------------------------------------------------


def test_the_config_has_its_shape(client: TestClient, settings: Settings) -> None:
    """LOC-CONFIG-01..09: every key in its type, no user keys yet, the launch line,
    valid, no reload with no model loaded (open point 30), no plan, auto_plan false (no
    `--auto-plan`)."""
    config = client.get("/api/config").json()
    assert set(config) == {
        "values",
        "user_keys",
        "operator_keys",
        "args",
        "valid",
        "error",
        "reload_required",
        "plan",
        "auto_plan",
    }
    assert list(config["values"]) == [param.key for param in table()]
    assert config["user_keys"] == []
    assert config["args"][:2] == ["--model", settings.model]
    assert (config["valid"], config["error"]) == (True, "")
    assert config["reload_required"] is False
    assert config["plan"] is None and config["auto_plan"] is False


def test_put_sets_values_and_user_keys_and_args(client: TestClient) -> None:
    """LOC-CONC-03, LOC-CONFIG-04, -10, -11, -14: set keys join user_keys; args carry
    flag and value as separate strings; "auto" where accepted."""
    change = put(client, {"values": {"threads": 6, "temp": 1, "think": True, "ctx-size": "auto"}})
    assert change["rejected"] == {}
    assert change["values"]["threads"] == 6
    assert change["values"]["temp"] == 1.0 and isinstance(change["values"]["temp"], float)
    assert change["user_keys"] == ["ctx-size", "threads", "temp", "think"]
    args = change["args"]
    assert args[args.index("--threads") + 1] == "6"
    assert client.get("/api/config").json() == {k: v for k, v in change.items() if k != "rejected"}


def test_reset_returns_a_key_to_the_default(client: TestClient) -> None:
    """LOC-CONFIG-12: a reset key takes the server default and leaves user_keys."""
    default = client.get("/api/config").json()["values"]["top-k"]
    put(client, {"values": {"top-k": 7, "seed": 1}})
    change = put(client, {"reset": ["top-k"]})
    assert change["values"]["top-k"] == default
    assert change["user_keys"] == ["seed"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("think", 1),  # a bool must be a JSON boolean (LOC-CONC-04)
        ("n-predict", True),  # an int is not a boolean
        ("n-predict", 5.0),  # nor a float (open point 38)
        ("temp", "0.5"),  # a float is a JSON number
        ("model", 3),  # a path is a string (LOC-CONC-05)
        ("temp", 2.5),  # above max (LOC-PARAMS-13)
        ("top-k", -1),  # below min
        ("engine", "vllm"),  # an unknown choice
        ("n-predict", "auto"),  # "auto" without accepts_auto (LOC-CONC-06)
        ("nonsense", 1),  # an unknown key (open point 33)
        ("data-dir", "/tmp/elsewhere"),  # writes files: launch only (LOC-SEC-57)
    ],
)
def test_a_value_that_does_not_parse_is_rejected_while_the_rest_applies(
    client: TestClient, key: str, value: Any
) -> None:
    """LOC-CONFIG-15, LOC-SEC-57: listed in `rejected`, unchanged, the other keys applied."""
    before = client.get("/api/config").json()["values"].get(key)
    change = put(client, {"values": {key: value, "seed": 42}})
    assert set(change["rejected"]) == {key}
    assert change["rejected"][key]
    assert change["values"].get(key) == before
    assert key not in change["user_keys"]
    assert change["values"]["seed"] == 42 and change["user_keys"] == ["seed"]


def test_typical_is_guidance_not_a_limit(client: TestClient) -> None:
    """LOC-PARAMS-15: outside `typical` but inside min/max is accepted."""
    change = put(client, {"values": {"top-k": 500, "temp": 1.9}})
    assert change["rejected"] == {}
    assert (change["values"]["top-k"], change["values"]["temp"]) == (500, 1.9)


def test_an_invalid_config_is_stored(client: TestClient, settings: Settings) -> None:
    """LOC-CONFIG-13, -16: stored with valid false and the reason; fixing it validates.
    LOC-LOAD-12: `n-gpu-layers` other than 0 is valid (turned off at the load)."""
    change = put(client, {"values": {"model": "no/such/model.gguf"}})
    assert change["rejected"] == {}
    assert change["valid"] is False and "model" in change["error"]
    assert stored(settings)["values"] == {"model": "no/such/model.gguf"}
    change = put(client, {"values": {"n-gpu-layers": 8}, "reset": ["model"]})
    assert (change["valid"], change["error"]) == (True, "")
    assert stored(settings)["values"] == {"n-gpu-layers": 8}


@pytest.mark.parametrize("offload", [False, True])
def test_gpu_layers_reach_a_gpu_build_alone(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, offload: bool
) -> None:
    """Issue 48 item 2, LOC-LOAD-12: the next load gets `n-gpu-layers` where llama-cpp-python
    has a GPU backend, 0 on a CPU build; `device` goes to the load as set."""
    monkeypatch.setattr(config_mod, "gpu_offload", lambda: offload)
    put(client, {"values": {"n-gpu-layers": 8, "device": "cuda:1"}})
    options = client.app.state.config.load_options()  # type: ignore[attr-defined]
    assert (options.n_gpu_layers, options.device) == (8 if offload else 0, "cuda:1")


def test_auto_plan_is_the_person_s_choice_once_made(settings: Settings) -> None:
    """LOC-CONFIG-09, LOC-CONFIG-18, LOC-CONFIG-19: `auto_plan` starts as the launch's (off
    without `--auto-plan`, on with it); set over PUT it is saved, survives a restart and wins
    over the launch's."""
    with LocalClient(Server(settings, preload=False)) as client:
        assert client.get("/api/config").json()["auto_plan"] is False
    launched = replace(settings, auto_plan=True)
    with LocalClient(Server(launched, preload=False)) as client:
        assert client.get("/api/config").json()["auto_plan"] is True
        change = put(client, {"auto_plan": False})
        assert change["rejected"] == {} and change["auto_plan"] is False
    assert stored(settings)["auto_plan"] is False
    with LocalClient(Server(launched, preload=False)) as client:
        assert client.get("/api/config").json()["auto_plan"] is False  # the choice survives
        assert put(client, {"auto_plan": True})["auto_plan"] is True
    with LocalClient(Server(settings, preload=False)) as client:
        assert client.get("/api/config").json()["auto_plan"] is True


def test_a_body_that_is_not_an_object_is_refused(client: TestClient) -> None:
    """The spec's validator: a non-object body or `values` is a 400."""
    for body in (b"[1]", b'{"values": [1]}', b'{"reset": "top-k"}'):
        response = client.put("/api/config", content=body, headers=JSON)
        assert response.status_code == 400


# -- persistence -----------------------------------------------------------------------


def test_the_config_survives_a_restart(settings: Settings) -> None:
    """LOC-CONFIG-19, -20, LOC-CONC-12: values and user_keys come back; only user-set keys
    are saved, so the others follow the defaults of the next start."""
    with LocalClient(Server(settings, preload=False)) as client:
        put(client, {"values": {"threads": 3, "top-p": 0.5}, "auto_plan": False})
    assert stored(settings) == {
        "values": {"threads": 3, "top-p": 0.5},
        "user_keys": ["threads", "top-p"],
        "plan": None,
        "auto_plan": False,
    }
    newer = replace(settings, default_max_tokens=777)
    with LocalClient(Server(newer, preload=False)) as client:
        config = client.get("/api/config").json()
    assert config["user_keys"] == ["threads", "top-p"]
    assert (config["values"]["threads"], config["values"]["top-p"]) == (3, 0.5)
    assert config["values"]["n-predict"] == 777  # not frozen by the first run


def test_with_a_database_url_the_config_is_a_row_every_server_on_it_reads(
    settings: Settings, postgres: PostgresServer, tmp_path: Path
) -> None:
    """Issue 49 (the state in PostgreSQL when a DSN is given): the config is kept in the
    database, not in a settings.json of one machine's data dir, so a server with another
    data dir on the same database (a replica on another machine) starts with it; a
    corrupt row is logged and ignored as a corrupt file is (LOC-CONFIG-20)."""
    on_postgres = replace(settings, database_url=postgres.fresh())
    with LocalClient(Server(on_postgres, preload=False)) as client:
        put(client, {"values": {"threads": 3, "top-p": 0.5}, "auto_plan": False})
    assert not (settings.data_dir / SETTINGS_FILE).exists()
    elsewhere = replace(on_postgres, data_dir=tmp_path / "elsewhere")
    with LocalClient(Server(elsewhere, preload=False)) as client:
        config = client.get("/api/config").json()
    assert config["user_keys"] == ["threads", "top-p"]
    assert (config["values"]["threads"], config["values"]["top-p"]) == (3, 0.5)
    assert on_postgres.database_url is not None
    with psycopg.connect(on_postgres.database_url, autocommit=True) as db:
        db.execute("UPDATE settings_kv SET value = '{not json' WHERE key = %s", (CONFIG_KEY,))
    with LocalClient(Server(elsewhere, preload=False)) as client:
        config = client.get("/api/config").json()
    assert config["user_keys"] == [] and config["valid"] is True


@pytest.mark.parametrize(
    "text", ["{not json", "[]", '{"values": 3}', '{"values": {"threads": "many", "bogus": 1}}']
)
def test_an_unreadable_settings_file_starts_from_defaults(settings: Settings, text: str) -> None:
    """LOC-CONFIG-20: a corrupt settings.json is logged and ignored, never a crash."""
    settings.data_dir.mkdir(parents=True)
    (settings.data_dir / SETTINGS_FILE).write_text(text)
    with LocalClient(Server(settings, preload=False)) as client:
        config = client.get("/api/config").json()
    assert config["user_keys"] == [] and config["valid"] is True


def test_a_failed_write_leaves_the_old_file(
    client: TestClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Atomic replacement (DECISIONS, open point 6): a write that fails before the rename
    leaves the previous settings.json whole, no temp file, and the config unchanged."""
    put(client, {"values": {"threads": 2}})
    before = (settings.data_dir / SETTINGS_FILE).read_bytes()

    def refuse(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    response = client.put("/api/config", json={"values": {"threads": 9}}, headers=JSON)
    monkeypatch.undo()
    assert response.status_code == 500
    assert (settings.data_dir / SETTINGS_FILE).read_bytes() == before
    assert json.loads(before)["values"] == {"threads": 2}
    assert sorted(p.name for p in settings.data_dir.iterdir() if "settings" in p.name) == [
        SETTINGS_FILE
    ]
    assert client.get("/api/config").json()["values"]["threads"] == 2


# -- events and the loaded session -------------------------------------------------------


class Bus:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, name: str, data: dict[str, Any]) -> None:
        self.events.append((name, data))


class Manager:
    """Just what the config reads of the model manager: the resident session."""

    def __init__(self) -> None:
        self.resident: Resident | None = None
        self.on_change: Any = None

    def entry(self, model_id: str) -> object:
        return model_id


def _service(tmp_path: Path) -> tuple[ConfigService, Bus, Manager]:
    bus, manager = Bus(), Manager()
    defaults = {param.key: param.default for param in table()} | {"model": "m"}
    service = ConfigService(
        defaults, FileDocument(tmp_path / SETTINGS_FILE), bus, cast(ModelManager, manager)
    )
    return service, bus, manager


def test_every_change_emits_a_config_event(tmp_path: Path) -> None:
    """LOC-CONFIG-21: a `config` event with the new GET /api/config object per change;
    a request that changes nothing emits none."""
    service, bus, _ = _service(tmp_path)
    service.update({"threads": 5})
    service.update({"temp": "hot"})
    service.update(reset=["threads"])
    assert [name for name, _ in bus.events] == ["config", "config"]
    assert bus.events[0][1]["values"]["threads"] == 5
    assert bus.events[-1][1] == service.view()


def test_reload_required_follows_the_loaded_session(tmp_path: Path) -> None:
    """LOC-CONC-07..09, LOC-CONFIG-07: a session-scoped change while a model is loaded
    needs a reload; a request-scoped one does not; the next load clears it."""
    service, _, manager = _service(tmp_path)
    assert service.update({"ctx-size": 4096})["reload_required"] is False  # nothing loaded
    manager.resident = Resident(cast(Any, object()), cast(Any, object()))
    manager.on_change()
    assert service.update({"n-predict": 64, "think": True})["reload_required"] is False
    assert service.update({"ctx-size": 2048})["reload_required"] is True
    assert service.update({"ctx-size": 4096})["reload_required"] is False  # as loaded
    service.update({"batch-size": 256})
    manager.resident = Resident(
        cast(Any, object()), cast(Any, object())
    )  # loaded again, with the new values
    manager.on_change()
    assert service.view()["reload_required"] is False


# -- launch flags and the CLI (open point 31, LOC-PARAMS-02) --------------------------------


def test_launch_flags_are_operator_keys_never_persisted(tmp_path: Path) -> None:
    """REQ-003 open point 31, LOC-CONC-12: --threads and --default-max-tokens are the server's
    defaults, listed in `operator_keys`, below the user's values, and never saved."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", threads=3, default_max_tokens=99
    )
    with LocalClient(Server(settings, preload=False)) as client:
        config = client.get("/api/config").json()
        assert set(config["operator_keys"]) >= {"threads", "n-predict", "data-dir"}
        assert "model" not in config["operator_keys"] and config["user_keys"] == []
        assert (config["values"]["threads"], config["values"]["n-predict"]) == (3, 99)
        changed = put(client, {"values": {"n-predict": 7}})
        assert changed["values"]["n-predict"] == 7 and changed["user_keys"] == ["n-predict"]
    saved = json.loads((settings.data_dir / SETTINGS_FILE).read_text())
    assert saved["values"] == {"n-predict": 7}


def test_describe_params_prints_the_served_table(client: TestClient) -> None:
    """LOC-PARAMS-02: `miserver serve --describe-params` prints the same array as
    GET /api/params, `default` aside (the CLI's are the table's own)."""
    import subprocess
    import sys

    printed = subprocess.run(
        [sys.executable, "-m", "miserver.cli", "serve", "--describe-params"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    cli = json.loads(printed.stdout)
    served = client.get("/api/params").json()

    def without_default(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "default"} for row in rows]

    assert without_default(cli) == without_default(served)
    assert {row["key"]: row["default"] for row in cli}["model"] == ""


CHANGED = {
    "engine": "transformers",
    "ctx-size": 4096,
    "threads": 3,
    "batch-size": 256,
    "parallel": 4,
    "n-gpu-layers": 4,
    "dtype": "float32",
    "mmap": False,
    "mlock": True,
    "temp": 0.3,
    "top-k": 40,
    "top-p": 0.9,
    "seed": 7,
    "n-predict": 99,
    "think": True,
    "decide": False,
}
"""A value unlike the table's default for every row a user may set but `model`."""


def relaunched(args: list[str], data_dir: Path) -> Server:
    """The server `miserver serve ARGS` builds, parsed by the real command line, with its
    state in `data_dir` (so nothing the first server saved can answer for the flags)."""
    from miserver import cli
    from miserver import settings as settings_mod
    from miserver.local import params

    parsed = cli._parser().parse_args(["serve", *args])
    settings = replace(settings_mod.from_args(parsed), data_dir=data_dir, cache_dir=data_dir)
    return Server(settings, preload=False, flags=params.launch_values(parsed))


def test_args_reproduce_the_config(tmp_path: Path) -> None:
    """LOC-PARAMS-09, LOC-CONFIG-04, open point 31: every row's `flag` is a `miserver serve`
    flag, and a server launched with `args` (parsed by the real command line) has the same
    values, as the operator's: `operator_keys`, nothing persisted."""
    settings = Settings(data_dir=tmp_path / "a", cache_dir=tmp_path / "cache", model=MODEL_ID)
    with LocalClient(Server(settings, preload=False)) as client:
        change = put(client, {"values": CHANGED})
        assert change["rejected"] == {}
        args, values = change["args"], change["values"]
    assert args[args.index("--temp") + 1] == "0.3" and "--no-mmap" in args and "--mlock" in args
    assert "--think" in args and "--no-decide" in args
    with LocalClient(relaunched(args, tmp_path / "b")) as again:
        config = again.get("/api/config").json()
    assert {k: v for k, v in config["values"].items() if k != "data-dir"} == {
        k: v for k, v in values.items() if k != "data-dir"
    }
    assert set(config["operator_keys"]) >= set(CHANGED) and config["user_keys"] == []
    assert not (tmp_path / "b" / SETTINGS_FILE).exists()
    assert config["args"][config["args"].index("--data-dir") + 1] == str(tmp_path / "b")


@pytest.mark.parametrize(
    "args",
    [
        ["--temp", "2.5"],
        ["--top-k", "many"],
        ["--engine", "vllm"],
        ["--seed", "auto"],
        ["--parallel", "0"],
        ["--parallel", "65"],
    ],
    ids=[
        "above-max",
        "not-a-number",
        "unknown-choice",
        "auto-not-accepted",
        "parallel-below-min",
        "parallel-above-max",
    ],
)
def test_a_flag_the_row_refuses_stops_the_launch(args: list[str]) -> None:
    """LOC-PARAMS-09, -13: a launch flag is parsed by its row; a value the row refuses is a
    usage error (exit 2), never a silently different config."""
    from miserver import cli

    with pytest.raises(SystemExit) as stopped:
        cli._parser().parse_args(["serve", *args])
    assert stopped.value.code == 2


# -- continuous batching is on by default (issue 43, superseding OAI-CBM-01) ------------------


def test_parallel_is_auto_unless_set(client: TestClient) -> None:
    """Issue 43 (superseding OAI-CBM-01's opt-in): the `parallel` row is an advanced session
    int, 1 to 64 or "auto", default auto (the engine's loader picks the rows for the
    window, `LoadOptions.parallel` 0), so a server nobody configured batches; 1 keeps the
    serial path; values out of range are refused."""
    row = {row["key"]: row for row in client.get("/api/params").json()}["parallel"]
    assert (row["type"], row["scope"], row["group"], row["level"]) == (
        "int",
        "session",
        "compute",
        "advanced",
    )
    assert (row["flag"], row["min"], row["max"], row["default"]) == ("--parallel", 1, 64, "auto")
    assert row["accepts_auto"] is True
    assert client.get("/api/config").json()["values"]["parallel"] == "auto"
    server = cast(Server, client.app)
    assert server.state.config.load_options().parallel == 0
    change = put(client, {"values": {"parallel": 0, "top-k": 3}})
    assert set(change["rejected"]) == {"parallel"}
    change = put(client, {"values": {"parallel": 65}})
    assert set(change["rejected"]) == {"parallel"}
    change = put(client, {"values": {"parallel": 1}})
    assert change["rejected"] == {} and change["user_keys"] == ["parallel", "top-k"]
    assert server.state.config.load_options().parallel == 1
    put(client, {"values": {"parallel": "auto"}})
    assert server.state.config.load_options().parallel == 0


def test_cache_ram_is_auto_unless_set(client: TestClient) -> None:
    """Issue 43: the `cache-ram` row (the prompt cache's MiB) is an advanced session int,
    0 (off) or more, or "auto" (the default: `LoadOptions.cache_ram` -1, which the model
    manager turns into half the memory the model leaves, at most 8192 MiB)."""
    row = {row["key"]: row for row in client.get("/api/params").json()}["cache-ram"]
    assert (row["type"], row["scope"], row["level"], row["flag"], row["unit"]) == (
        "int",
        "session",
        "advanced",
        "--cache-ram",
        "MiB",
    )
    assert (row["min"], row["default"], row["accepts_auto"]) == (0, "auto", True)
    server = cast(Server, client.app)
    assert server.state.config.load_options().cache_ram == -1
    assert set(put(client, {"values": {"cache-ram": -1}})["rejected"]) == {"cache-ram"}
    assert put(client, {"values": {"cache-ram": 0}})["rejected"] == {}
    assert server.state.config.load_options().cache_ram == 0


def test_prefill_chunk_is_auto_unless_set(client: TestClient) -> None:
    """Issue 43: the `prefill-chunk` row (prompt tokens a step for a row that joins busy
    rows) is an advanced session int, 0 (a whole prompt a step) or more, or "auto" (the
    default: `LoadOptions.prefill_chunk` -1, which the loader makes PREFILL_CHUNK)."""
    row = {row["key"]: row for row in client.get("/api/params").json()}["prefill-chunk"]
    assert (row["type"], row["scope"], row["level"], row["flag"], row["unit"]) == (
        "int",
        "session",
        "advanced",
        "--prefill-chunk",
        "tokens",
    )
    assert (row["min"], row["default"], row["accepts_auto"]) == (0, "auto", True)
    server = cast(Server, client.app)
    assert server.state.config.load_options().prefill_chunk == -1
    assert chunk_of(-1) == PREFILL_CHUNK and chunk_of(0) == 0
    assert set(put(client, {"values": {"prefill-chunk": -1}})["rejected"]) == {"prefill-chunk"}
    assert put(client, {"values": {"prefill-chunk": 64}})["rejected"] == {}
    assert server.state.config.load_options().prefill_chunk == 64


def test_the_parallel_flag_reaches_the_config_and_the_next_load(tmp_path: Path) -> None:
    """OAI-CBM-01, LOC-PARAMS-09: `miserver serve --parallel 4` (parsed by the real command
    line) is the operator's `parallel`, in `args`, never saved, and the next load's
    `LoadOptions.parallel`."""
    server = relaunched(["--parallel", "4"], tmp_path / "data")
    with LocalClient(server) as client:
        config = client.get("/api/config").json()
    assert config["values"]["parallel"] == 4
    assert "parallel" in config["operator_keys"] and config["user_keys"] == []
    assert config["args"][config["args"].index("--parallel") + 1] == "4"
    assert server.state.config.load_options().parallel == 4
    assert not (tmp_path / "data" / SETTINGS_FILE).exists()
