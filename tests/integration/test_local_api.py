"""The local /api over HTTP: GET /api/models (LOC-MODELS), loads and unloads (LOC-LOAD,
LOC-UNLOAD), malformed bodies (LOC-GEN-14..16) and the loaded model's facts (LOC-INFO)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.transformers.conversion import cached_hf_folder
from miserver.models.catalog import shipped
from miserver.models.registry import embedded_default
from miserver.settings import Settings
from tests.conftest import JSON, LOCAL_URL, MODEL_ID, LocalClient, cache_dir
from tests.errors import error_of
from tests.events import Events
from tests.local_api import wait_until
from tests.models import CHATML, TEMPLATES, link_model
from tools.uvicorn_thread import uvicorn_serving


def test_the_listing_names_every_directory_and_model(tmp_path: Path) -> None:
    """LOC-MODELS-01..07, -11..14, -19, -21, -25: models_dir first then the scan dirs in
    order, one folder level deep, each entry with its keys; the real GGUF reads as llama."""
    models, scan_a, scan_b = tmp_path / "models", tmp_path / "a", tmp_path / "b"
    for folder in (models, scan_a / "inner", scan_b):
        folder.mkdir(parents=True)
    gguf = embedded_default()
    os.symlink(gguf, models / "smol.gguf")
    os.symlink(gguf, scan_a / "inner" / "nested.gguf")
    (scan_b / "deep" / "deeper").mkdir(parents=True)
    shutil.copyfile(gguf, scan_b / "deep" / "deeper" / "hidden.gguf")
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models,
        scan_dirs=(scan_a, scan_b),
    )
    with LocalClient(Server(settings, preload=False)) as client:
        response = client.get("/api/models")
    assert response.status_code == 200
    body = response.json()
    assert body["models_dir"] == str(models)
    assert body["scan_dirs"] == [str(scan_a), str(scan_b)]
    assert [e["id"] for e in body["catalog"]] == [e.id for e in shipped()]  # test_downloads.py
    names = [(m["name"], m["dir"], m["folder"]) for m in body["local"]]
    assert names == [("smol.gguf", str(models), ""), ("nested.gguf", str(scan_a), "inner")]
    first = body["local"][0]
    assert (first["arch"], first["role"], first["format"]) == ("llama", "model", "gguf")
    assert first["complete"] is True and first["shards"] == 1 and first["streamable"] is False
    assert first["files"] == [str(models / "smol.gguf")] and first["bytes"] == gguf.stat().st_size


def test_a_missing_scan_dir_lists_nothing(tmp_path: Path) -> None:
    """LOC-MODELS-03, -04: an empty models dir and a missing scan dir list nothing."""
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=tmp_path / "empty",
        scan_dirs=(tmp_path / "missing",),
    )
    with LocalClient(Server(settings, preload=False)) as client:
        body = client.get("/api/models").json()
    assert body["local"] == [] and body["scan_dirs"] == [str(tmp_path / "missing")]


def test_a_failed_load_leaves_state_error_with_its_reason(tmp_path: Path) -> None:
    """LOC-LOAD-05, -08, LOC-INFO-11, -12, -13: a load that fails after its 202 ends in
    `state: "error"` with `error` saying why; a later good load clears it."""
    models = tmp_path / "models"
    broken = models / "Broken-1"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text(
        '{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}', "utf-8"
    )
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID, models_dir=models
    )
    with LocalClient(Server(settings, preload=False)) as client:
        assert client.get("/api/info").json()["state"] == "empty"
        headers = {"Content-Type": "application/json"}
        response = client.post("/api/session/load", headers=headers, json={"model": "Broken-1"})
        assert response.status_code == 202
        info = wait_until(client, lambda found: found["state"] in {"error", "ready"})
        assert info["state"] == "error" and "Broken-1" in info["error"]
        assert info["model"] is None
        again = client.post("/api/session/load", headers=headers, json={"model": MODEL_ID})
        assert again.status_code == 202  # a named load sets `model`: Broken-1 was configured
        info = wait_until(client, lambda found: found["state"] == "ready")
        assert info["error"] == "" and info["model"]["id"] == MODEL_ID


def test_a_load_uses_the_config_and_refuses_an_invalid_one(tmp_path: Path) -> None:
    """LOC-LOAD-03, -04, -07, LOC-CONFIG-17: a body-less load takes the configured model,
    refused (400, nothing loads) while the stored config does not validate; a named load
    sets `model` first."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)
    headers = {"Content-Type": "application/json"}
    with LocalClient(Server(settings, preload=False)) as client:
        missing = {"values": {"model": "no/such/model.gguf"}}
        bad = client.put("/api/config", headers=headers, json=missing)
        assert bad.json()["valid"] is False
        refused = client.post("/api/session/load", headers=headers)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "config"
        assert client.get("/api/info").json()["state"] == "empty"
        client.put("/api/config", headers=headers, json={"reset": ["model"]})
        named = client.post("/api/session/load", headers=headers, json={"model": MODEL_ID})
        assert named.status_code == 202
        config = client.get("/api/config").json()
        assert config["values"]["model"] == MODEL_ID and "model" in config["user_keys"]
        assert wait_until(client, lambda found: found["state"] == "ready")["state"] == "ready"


# -- malformed /api bodies (LOC-GEN-14..16) --------------------------------------------------


def assert_refused_unchanged(
    client: TestClient, method: str, path: str, code: str, param: str | None, **body: Any
) -> None:
    """The request is 400 `code` naming `param`, and nothing changed: the config is as it was
    and no load started."""
    before = client.get("/api/config").json()
    error_of(client.request(method, path, headers=JSON, **body), 400, code, param)
    assert client.get("/api/config").json() == before
    assert client.get("/api/info").json()["state"] == "empty"


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", "/api/config"), ("POST", "/api/session/load"), ("POST", "/api/decide")],
)
@pytest.mark.parametrize(
    "body",
    [b'{"values": ', b"{'values': {}}", b"\xff\xfe", b"[1]", b'"text"', b"42", b"true", b"null"],
    ids=[
        "LOC-GEN-14-cut",
        "LOC-GEN-14-quotes",
        "LOC-GEN-14-bytes",
        *[f"LOC-GEN-15-{kind}" for kind in ("array", "string", "number", "boolean", "null")],
    ],
)
def test_a_body_not_a_json_object_is_invalid_request(
    bare_client: TestClient, method: str, path: str, body: bytes
) -> None:
    """LOC-GEN-14, -15, -17, LOC-GEN-09 (OpenAI's shape, DECISIONS.md): a body that is not
    JSON, or JSON but not an object (`null` included), is 400 invalid_request; nothing
    changes (no load starts, the config stays as it was)."""
    assert_refused_unchanged(bare_client, method, path, "invalid_request", None, content=body)


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("PUT", "/api/config", {"values": [1]}, "values"),
        ("PUT", "/api/config", {"reset": "top-k"}, "reset"),
        ("PUT", "/api/config", {"reset": [{"key": "top-k"}]}, "reset[0]"),
        ("PUT", "/api/config", {"auto_plan": "no"}, "auto_plan"),
        ("POST", "/api/session/load", {"model": 3}, "model"),
        ("POST", "/api/session/load", {"model": {"id": MODEL_ID}}, "model"),
        ("POST", "/api/decide", {"prefix": 1, "suffix": "", "choices": ["a"]}, "prefix"),
        ("POST", "/api/decide", {"prefix": "", "suffix": "", "choices": [["a"]]}, "choices[0]"),
        ("POST", "/api/steering/attachments", {"sae_id": 5}, "sae_id"),
        ("PUT", "/api/profiles/p", {"sae_id": "s", "layer": "3", "features": []}, "layer"),
    ],
    ids=[
        "LOC-GEN-16-values-array",
        "LOC-GEN-16-reset-string",
        "LOC-GEN-16-reset-object",
        "LOC-GEN-16-auto_plan-string",
        "LOC-GEN-16-model-number",
        "LOC-GEN-16-model-object",
        "LOC-GEN-16-prefix-number",
        "LOC-GEN-16-choice-array",
        "LOC-GEN-16-sae_id-number",
        "LOC-GEN-16-layer-string",
    ],
)
def test_a_field_of_the_wrong_type_is_invalid_request(
    bare_client: TestClient, method: str, path: str, body: dict[str, Any], param: str
) -> None:
    """LOC-GEN-16, -17: a field of the wrong JSON type is 400 invalid_request naming the
    field, never 500; nothing changes. (/v1 keeps invalid_parameter: test_refusals.py.)"""
    assert_refused_unchanged(bare_client, method, path, "invalid_request", param, json=body)


@pytest.mark.parametrize(
    ("method", "path", "body", "param"),
    [
        ("POST", "/api/session/load", {"model": ""}, "model"),
        ("POST", "/api/steering/attachments", {"sae_id": "s", "layer": -1}, "layer"),
        ("POST", "/api/decide", {"prefix": "", "suffix": ""}, "choices"),
    ],
    ids=["too-short", "below-minimum", "missing"],
)
def test_a_value_the_schema_refuses_stays_invalid_parameter(
    bare_client: TestClient, method: str, path: str, body: dict[str, Any], param: str
) -> None:
    """LOC-GEN-16 covers types only: a well-typed value the schema refuses (a length, a
    minimum, a missing field) is 400 invalid_parameter naming it (REQ-000 open point 9)."""
    assert_refused_unchanged(bare_client, method, path, "invalid_parameter", param, json=body)


def test_a_missing_required_body_is_invalid_request(bare_client: TestClient) -> None:
    """LOC-GEN-16, -21: a body-less PUT /api/config (its body is required) is 400
    invalid_request; a body-less load, whose body is optional, is not refused as a body."""
    response = bare_client.put("/api/config", headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    bare_client.put("/api/config", json={"values": {"model": "no/such/model.gguf"}}, headers=JSON)
    refused = bare_client.post("/api/session/load", headers=JSON)  # the stored config's fault
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "config"


def test_v1_keeps_openai_codes(bare_client: TestClient) -> None:
    """LOC-CHAT-04 with OAI-ERR-01: an unknown role on /v1 is 400 invalid_request naming
    `messages[0].role` (document 000 names no code for it); bad JSON stays invalid_json."""
    body = {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "hi"}]}
    response = bare_client.post("/v1/chat/completions", json=body, headers=JSON)
    error_of(response, 400, "invalid_request", "messages[0].role")
    response = bare_client.post("/v1/chat/completions", content=b"{", headers=JSON)
    error_of(response, 400, "invalid_json", None)


# -- unload and a second load (REQ-003 open point 8) ------------------------------------------


def test_unload_answers_ok(bare_client: TestClient) -> None:
    """LOC-UNLOAD-02, REQ-003 open point 8: unload is 200 `{"ok": true}` (with `unloaded`:
    whether a model was loaded to release)."""
    response = bare_client.post("/api/session/unload", headers=JSON)
    assert response.status_code == 200
    assert response.json() == {"ok": True, "unloaded": False}


@pytest.mark.model
def test_a_second_load_while_one_runs_is_busy(bare_client: TestClient) -> None:
    """REQ-003 open point 8, LOC-SEC-68: while a load runs (here held behind the slot's
    holder, as behind a running generation), a second load is 409 busy and changes nothing
    (`model` keeps the first load's value); once the first ends, loads are taken again."""
    client = bare_client
    scheduler = client.app.state.scheduler  # type: ignore[attr-defined]
    holder = client.portal.call(scheduler.enter)  # type: ignore[union-attr]
    try:
        first = client.post("/api/session/load", json={"model": MODEL_ID}, headers=JSON)
        assert first.status_code == 202
        second = client.post("/api/session/load", json={"model": f"{MODEL_ID}:Q4_1"}, headers=JSON)
        error = error_of(second, 409, "busy", None)
        assert "load" in error["message"]
        assert client.post("/api/session/load", headers=JSON).status_code == 409  # body-less too
        assert client.get("/api/config").json()["values"]["model"] == MODEL_ID
    finally:
        client.portal.call(scheduler.leave, holder)  # type: ignore[union-attr]
    info = wait_until(client, lambda found: found["state"] == "ready")
    assert info["model"]["id"] == MODEL_ID
    again = client.post("/api/session/load", json={"model": MODEL_ID}, headers=JSON)
    assert again.status_code == 202
    assert wait_until(client, lambda found: found["state"] == "ready")["state"] == "ready"


# -- the loaded model's facts (LOC-INFO-14/15) and settings turned off (LOC-LOAD-12) ----------

ALWAYS_THINKS = CHATML.replace(
    "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}"
)
"""A template that opens a reasoning span on every reply and reads no `enable_thinking`."""


@pytest.fixture(scope="module")
def info_models(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    """SmolLM2's HF folder twice: under the Qwen3-style template with `num_experts_per_tok`
    in its config.json (transformers ignores the key), and under a template that always
    thinks."""
    source = cached_hf_folder(gguf_path, cache_dir(), lambda _msg: None)
    models = tmp_path_factory.mktemp("info-models")
    link_model(models, "Smol-qwen3", (TEMPLATES / "qwen3.jinja").read_text("utf-8"))
    config = json.loads((source / "config.json").read_text("utf-8"))
    (models / "Smol-qwen3" / "config.json").unlink()
    (models / "Smol-qwen3" / "config.json").write_text(
        json.dumps({**config, "num_experts_per_tok": 2}), "utf-8"
    )
    link_model(models, "Smol-always", ALWAYS_THINKS)
    return models


@pytest.mark.model
@pytest.mark.parametrize(
    ("model", "think_ctl", "experts"),
    [("Smol-qwen3", "template", 2), ("Smol-always", "always", 0), (MODEL_ID, "none", 0)],
    ids=["template", "always", "none"],
)
def test_info_reads_the_model(
    tmp_path: Path, info_models: Path, model: str, think_ctl: str, experts: int
) -> None:
    """LOC-INFO-14, -15, REQ-003 open point 15: `think_ctl` is `template` only when the
    chat template reads `enable_thinking`, `always` when it writes a reasoning span it cannot
    turn off, `none` otherwise (SmolLM2's own); `n_expert_used` is the model's own
    `num_experts_per_tok`, 0 for a dense model. LOC-INFO-03, -04, -08, -18 (adapted): no
    overlap; the planner is there but a load does not plan (no `auto_plan` yet), so it never
    reports `planning`; every busy thread is a compute thread."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID, models_dir=info_models
    )
    states: list[str] = []

    def loaded(found: dict[str, Any]) -> bool:
        states.append(found["state"])
        return found["state"] in {"ready", "error"}

    with LocalClient(Server(settings, preload=False)) as client:
        response = client.post("/api/session/load", json={"model": model}, headers=JSON)
        assert response.status_code == 202
        info = wait_until(client, loaded)
    assert info["state"] == "ready", info["error"]
    assert info["model"]["id"] == model
    assert (info["model"]["think_ctl"], info["model"]["n_expert_used"]) == (think_ctl, experts)
    assert info["overlap_available"] is False and info["planner_available"] is True
    assert "planning" not in states
    assert info["model"]["busy_threads"] == info["model"]["compute_threads"]


@pytest.mark.model
def test_gpu_layers_are_turned_off_with_a_warning(tmp_path: Path) -> None:
    """LOC-LOAD-12 (adapted): `n-gpu-layers` 8 is a valid config on this CPU build; the load
    turns it off and says so as a `log` event with level `warn`, and the model loads."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)
    with uvicorn_serving(Server(settings, preload=False)) as port:
        api = f"{LOCAL_URL}:{port}/api"
        config = httpx.put(f"{api}/config", json={"values": {"n-gpu-layers": 8}}, headers=JSON)
        assert config.status_code == 200 and config.json()["valid"] is True
        with Events(f"{LOCAL_URL}:{port}") as events:
            loading = httpx.post(f"{api}/session/load", headers=JSON, timeout=60)
            assert loading.status_code == 202
            events.wait_for(lambda _: events.named("state")[-1]["state"] == "ready", timeout=120)
        warnings = [log for log in events.named("log") if log["level"] == "warn"]
        assert any("n-gpu-layers 8 turned off" in log["message"] for log in warnings), warnings
        assert httpx.get(f"{api}/info").json()["model"]["id"] == MODEL_ID


@pytest.mark.model
def test_a_gpu_this_process_cannot_see_is_turned_off_with_a_warning(tmp_path: Path) -> None:
    """LOC-LOAD-12 (adapted), issue 48: `device` `cuda:1` is a valid config; on this machine
    (no CUDA) the load turns it off, says so as a `warn` log event naming the device, and
    the model loads on the CPU in float32 (`dtype` auto there)."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)
    with uvicorn_serving(Server(settings, preload=False)) as port:
        api = f"{LOCAL_URL}:{port}/api"
        config = httpx.put(f"{api}/config", json={"values": {"device": "cuda:1"}}, headers=JSON)
        assert config.status_code == 200 and config.json()["valid"] is True
        with Events(f"{LOCAL_URL}:{port}") as events:
            loading = httpx.post(f"{api}/session/load", headers=JSON, timeout=60)
            assert loading.status_code == 202
            events.wait_for(lambda _: events.named("state")[-1]["state"] == "ready", timeout=120)
        warnings = [log["message"] for log in events.named("log") if log["level"] == "warn"]
        assert any("device cuda:1 is not available" in m for m in warnings), warnings
        health = httpx.get(f"{api}/health/inference").json()
        assert (health["model"], health["device"]) == (MODEL_ID, "cpu")
        chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = httpx.post(f"{LOCAL_URL}:{port}/v1/chat/completions", json=chat, timeout=60)
        assert ":float32/" in reply.json()["system_fingerprint"]
