"""GET /api/plan and POST /api/plan/apply over real HTTP, with the real probes of this
machine (REQ-003 PLAN, APPLY, EVENTS-22..24, SEC-68/69, CONFIG-08; issue 21)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import JSON, TIMING, cache_dir
from tests.events import Events
from tools.fakehub import Hub, serve_hub
from tools.uvicorn_thread import uvicorn_serving

WAIT_S = 120.0
PROBES_S = 2.0  # LOC-PLAN-05: the probes are "a second or two" of reads and a bandwidth run
LOADED_MARGIN = 5  # a shared 2-core machine running other tests beside this one

pytestmark = pytest.mark.xdist_group(TIMING)  # LOC-PLAN-05's bound, real probes


class Running:
    def __init__(self, port: int, data: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.data = data
        self.api = httpx.Client(base_url=f"{self.base}/api", timeout=WAIT_S)

    def plan(self, query: str = "") -> dict[str, Any]:
        answer = self.api.get(f"/plan{query}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def load(self) -> str:
        assert self.api.post("/session/load", json={}, headers=JSON).status_code == 202
        deadline = time.monotonic() + WAIT_S
        while (info := self.api.get("/info").json())["state"] not in ("ready", "error"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert info["state"] == "ready", info
        return str(info["model"]["id"])


def serving(tmp_path: Path, **changes: Any) -> Iterator[Running]:
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=tmp_path / "models",
        **changes,
    )
    with uvicorn_serving(Server(settings, preload=False), graceful_s=1.0) as port:
        running = Running(port, tmp_path / "data")
        yield running
        running.api.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Running]:
    yield from serving(tmp_path)


def test_a_plan_measures_this_machine_without_loading_the_model(server: Running) -> None:
    """LOC-PLAN-03, LOC-PLAN-04, LOC-PLAN-05, LOC-LOAD-11, LOC-INFO-04, LOC-EVENTS-22,
    LOC-EVENTS-23, LOC-EVENTS-24, LOC-PLAN-49, LOC-PLAN-50, LOC-PLAN-51, LOC-PLAN-52: the
    real probes of this machine, in LOC-PLAN-05's second or two (with a margin for a loaded
    machine), report each stage as a `plan_progress` event and end with `done`; nothing is
    loaded; `?cached=1` answers `none` before any plan and the last plan after, without
    measuring; `?measure=1` measures again."""
    assert server.api.get("/info").json()["planner_available"] is True
    assert server.plan("?cached=1") == {"available": True, "none": True}
    with Events(server.base) as events:
        started = time.monotonic()
        proposal = server.plan()
        took = time.monotonic() - started
        events.wait_for(lambda seen: any(d.get("step") == "done" for n, d in seen))
    assert took < PROBES_S * LOADED_MARGIN, took  # the whole GET, probes and all
    steps = [d for n, d in events.seen if n == "plan_progress"]
    assert [d["step"] for d in steps] == [
        "devices",
        "model",
        "compute",
        "storage",
        "memory",
        "placement",
        "rules",
        "done",
    ]
    assert all(d["index"] == i and d["count"] == 7 and d["label"] for i, d in enumerate(steps[:-1]))
    assert proposal["available"] is True and proposal["model"].startswith("SmolLM2")
    assert proposal["values"]["threads"] >= 1 and proposal["predicted"]["s_per_token"] > 0
    assert "warning" not in proposal
    assert server.api.get("/info").json()["state"] == "empty"
    with Events(server.base) as events:
        cached = server.plan("?cached=1")
        time.sleep(0.3)
    assert cached == proposal | {"cached": True}
    assert not [n for n, _ in events.seen if n == "plan_progress"]
    again = server.plan("?measure=1")
    assert again["model"] == proposal["model"] and again["machine"] != ""


def test_applying_a_plan_sets_its_layer_and_never_a_person_s_key(
    server: Running, tmp_path: Path
) -> None:
    """LOC-APPLY-01, LOC-APPLY-02, LOC-APPLY-03, LOC-APPLY-04, LOC-APPLY-05, LOC-APPLY-06,
    LOC-APPLY-07, LOC-APPLY-08, LOC-CONFIG-08, LOC-PLAN-14: nothing to apply is 409
    `no_plan`; applied, the plan's values are the config's, its decisions under `plan`, a
    `config` event sent, `user_keys` unchanged and a person's key kept; a later plan made
    with `ctx-size` set by the person replaces the first whole (its `ctx-size` gone); the
    plan survives a restart."""
    refused = server.api.post("/plan/apply", headers=JSON)
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "no_plan")
    server.api.put("/config", json={"values": {"threads": 1}}, headers=JSON)
    first = server.plan()
    assert next(d for d in first["decisions"] if d["knob"] == "threads")["source"] == "operator"
    assert "threads" not in first["values"] and first["values"]["ctx-size"] == 8192
    with Events(server.base) as events:
        config = server.api.post("/plan/apply", headers=JSON).json()
        events.wait_for(lambda seen: any(n == "config" for n, _ in seen))
    assert config["user_keys"] == ["threads"] and config["values"]["threads"] == 1
    for key, value in first["values"].items():
        assert config["values"][key] == value
    assert config["plan"]["model"] == first["model"]
    assert {d["knob"] for d in config["plan"]["decisions"]} >= set(first["values"])
    assert server.api.get("/config").json()["plan"] == config["plan"]
    server.api.put("/config", json={"values": {"ctx-size": 1024}}, headers=JSON)
    second = server.plan()
    assert "ctx-size" not in second["values"]
    applied = server.api.post("/plan/apply", headers=JSON).json()
    assert applied["values"]["ctx-size"] == 1024  # the person's
    server.api.put("/config", json={"reset": ["ctx-size"]}, headers=JSON)
    after = server.api.get("/config").json()
    assert after["values"]["ctx-size"] == "auto"  # the first plan's 8192 is gone with it
    stored = json.loads((server.data / "settings.json").read_text())
    assert stored["plan"]["values"] == second["values"] and stored["user_keys"] == ["threads"]
    server.api.close()


def test_the_plan_layer_survives_a_restart(tmp_path: Path) -> None:
    """LOC-APPLY-03, LOC-CONFIG-20: an applied plan is kept in settings.json and restored."""
    for run in range(2):
        for running in serving(tmp_path):
            if run == 0:
                planned = running.plan()
                running.api.post("/plan/apply", headers=JSON)
            else:
                restored = running.api.get("/config").json()
                assert restored["plan"]["values"] == planned["values"]
                assert restored["values"]["parallel"] == planned["values"]["parallel"]


def test_with_no_model_configured_there_is_nothing_to_plan(server: Running) -> None:
    """LOC-PLAN-02: no model selected: `{"available": true, "error"}`."""
    server.api.put("/config", json={"values": {"model": ""}}, headers=JSON)
    answer = server.plan()
    assert answer["available"] is True and "model" in answer["error"]
    assert set(answer) == {"available", "error"}


def test_a_plan_with_a_model_loaded_warns_and_measures_a_turn(server: Running) -> None:
    """LOC-PLAN-06, LOC-PLAN-47, LOC-PLAN-48, LOC-PLAN-53, LOC-SEC-68: planned with a model
    loaded, the plan warns; once that model has answered a whole turn the plan carries
    `measured` (a cancelled turn does not count); while a generation runs a measurement is
    409 `busy`."""
    loaded = server.load()
    proposal = server.plan()
    assert loaded in proposal["warning"] and "measured" not in proposal
    reply = httpx.post(
        f"{server.base}/v1/chat/completions",
        json={"model": loaded, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
        timeout=WAIT_S,
    )
    assert reply.status_code == 200
    turn = server.plan("?cached=1")["measured"]
    assert turn["cache_hit_pct"] == -1 and turn["tokens"] >= 2 and turn["s_per_token"] > 0
    busy: list[httpx.Response] = []
    first_token = threading.Event()

    def long_reply() -> None:
        body = {
            "model": loaded,
            "messages": [{"role": "user", "content": "Count to a thousand."}],
            "max_tokens": 400,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{server.base}/v1/chat/completions", json=body, timeout=WAIT_S
        ) as stream:
            for _ in stream.iter_lines():
                first_token.set()

    worker = threading.Thread(target=long_reply)
    worker.start()
    assert first_token.wait(WAIT_S)
    busy.append(server.api.get("/plan"))
    server.api.post("/cancel", headers=JSON)
    worker.join(WAIT_S)
    assert (busy[0].status_code, busy[0].json()["error"]["code"]) == (409, "busy")
    assert server.plan("?cached=1")["measured"] == turn  # the cancelled turn left it


def test_measurements_loads_and_unloads_never_overlap(server: Running) -> None:
    """LOC-SEC-68, LOC-SEC-69: while a measurement runs, a second one, a load and an unload
    are each 409 `busy`; once it ends they go through."""
    answers: list[httpx.Response] = []
    with Events(server.base) as events:
        first = threading.Thread(target=lambda: answers.append(server.api.get("/plan")))
        first.start()
        events.wait_for(lambda seen: any(n == "plan_progress" for n, _ in seen))
        refused = [
            server.api.get("/plan?measure=1"),
            server.api.post("/session/load", json={}, headers=JSON),
            server.api.post("/session/unload", headers=JSON),
        ]
        first.join(WAIT_S)
    for answer in refused:
        assert (answer.status_code, answer.json()["error"]["code"]) == (409, "busy"), answer.text
    assert answers[0].status_code == 200
    assert server.api.post("/session/unload", headers=JSON).status_code == 200


def test_an_auto_load_plans_first_and_keeps_that_plan(tmp_path: Path, gguf_path: Path) -> None:
    """LOC-LOAD-09, LOC-LOAD-10, LOC-LOAD-11, LOC-INFO-08, LOC-PLAN-46, LOC-PLAN-54,
    LOC-HFI-22, LOC-HFI-23: with `auto_plan` on, a load unloads, reports `planning` (no
    model) while it measures, applies the plan and only then answers 202; GET /api/plan
    then answers that plan at once (`from_last_load`, no measurement, no warning), and
    inspect charges the loaded model what its plan's ledger holds."""
    hub = Hub()
    hub.add("fake-org/tiny-GGUF", "tiny-Q4_1.gguf", gguf_path.read_bytes())
    with serve_hub(hub) as site:
        for server in serving(tmp_path, hf_endpoint=site):
            _auto_load(server)


def _auto_load(server: Running) -> None:
    loaded = server.load()  # a session the auto load replaces
    assert server.api.put("/config", json={"auto_plan": True}, headers=JSON).status_code == 200
    with Events(server.base) as events:
        started = time.monotonic()
        answer = server.api.post("/session/load", json={}, headers=JSON)
        took = time.monotonic() - started
        assert answer.status_code == 202
        events.wait_for(lambda seen: any(d.get("step") == "done" for n, d in seen))
    states = [d for n, d in events.seen if n == "state"]
    planning = [d for d in states if d["state"] == "planning"]
    assert planning and all(d["model"] is None for d in planning)
    assert any(d.get("step") == "done" for n, d in events.seen if n == "plan_progress")
    assert 0.5 < took < 30  # the probes ran inside the request
    deadline = time.monotonic() + WAIT_S
    while (info := server.api.get("/info").json())["state"] != "ready":
        assert time.monotonic() < deadline and info["state"] != "error", info
        time.sleep(0.1)
    config = server.api.get("/config").json()
    assert (
        config["plan"] is not None
        and config["values"]["parallel"] == (config["plan"]["values"]["parallel"])
    )
    with Events(server.base) as events:
        kept = server.plan()
        time.sleep(0.3)
    assert kept["from_last_load"] is True and kept["model"] == loaded
    assert "warning" not in kept
    assert not [n for n, _ in events.seen if n == "plan_progress"]
    held = kept["memory"]["pools"][0]["held_bytes"]
    ask = {"repo": "fake-org/tiny-GGUF", "name": "tiny-Q4_1.gguf"}
    found = server.api.post("/hf/inspect", json=ask, headers=JSON).json()
    assert (found["machine"]["loaded_model"], found["machine"]["loaded_held"]) == (loaded, held)
    assert (
        held > 0
        and f"counting the {held >> 20} MiB {loaded} holds now" in (found["verdict"]["memory"])
    )


def test_serve_with_auto_plan_plans_its_first_load(tmp_path: Path) -> None:
    """LOC-LOAD-09 (`--auto-plan` on serve): the start's own load is planned, and its plan
    is the one GET /api/plan answers."""
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=tmp_path / "models",
        auto_plan=True,
    )
    with uvicorn_serving(Server(settings), graceful_s=1.0) as port:
        running = Running(port, tmp_path / "data")
        assert running.api.get("/info").json()["state"] == "ready"
        answer = running.plan()
        assert answer["from_last_load"] is True and "values" in answer
        assert running.api.get("/config").json()["plan"]["values"] == answer["values"]
        running.api.close()


def test_a_launch_flag_is_pinned_like_a_person_s_key(tmp_path: Path) -> None:
    """LOC-PLAN-14, LOC-CONC-13 (docs/DECISIONS.md, contract 0.15.0): a key the operator gave
    at launch (`--threads 1`) comes back `operator` and `kept`; the plan leaves it out."""
    for running in serving(tmp_path, threads=1):
        proposal = running.plan()
        threads = next(d for d in proposal["decisions"] if d["knob"] == "threads")
        assert (threads["source"], threads["group"], threads["value"]) == ("operator", "kept", 1)
        assert "threads" not in proposal["values"]


def test_the_start_s_own_load_reads_the_engine(tmp_path: Path) -> None:
    """LOC-PARAMS-21 (adapted), LOC-CONFIG-04: `miserver serve --engine transformers` serves
    the launch model on transformers from the start, as a load through /api would."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), models_dir=tmp_path / "models"
    )
    server = Server(settings, flags={"engine": "transformers"})
    with uvicorn_serving(server, graceful_s=1.0) as port:
        info = httpx.get(f"http://127.0.0.1:{port}/api/info", timeout=WAIT_S).json()
    assert info["state"] == "ready" and info["model"]["engine"] == "transformers"
