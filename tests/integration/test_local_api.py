"""The local /api over HTTP: GET /api/models (LOC-MODELS) and a load that fails (LOC-INFO)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from miserver.app import Server
from miserver.models.registry import embedded_default
from miserver.settings import Settings
from tests.conftest import MODEL_ID, LocalClient, cache_dir


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
    assert body["catalog"] == []
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


def wait_until(client: LocalClient, done: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, Any] = client.get("/api/info").json()
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_load_uses_the_config_and_refuses_an_invalid_one(tmp_path: Path) -> None:
    """LOC-LOAD-03, -04, -07, LOC-CONFIG-17: a body-less load takes the configured model,
    refused (400, nothing loads) while the stored config does not validate; a named load
    sets `model` first."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)
    headers = {"Content-Type": "application/json"}
    with LocalClient(Server(settings, preload=False)) as client:
        bad = client.put("/api/config", headers=headers, json={"values": {"n-gpu-layers": 1}})
        assert bad.json()["valid"] is False
        refused = client.post("/api/session/load", headers=headers)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "config"
        assert client.get("/api/info").json()["state"] == "empty"
        client.put("/api/config", headers=headers, json={"reset": ["n-gpu-layers"]})
        named = client.post("/api/session/load", headers=headers, json={"model": MODEL_ID})
        assert named.status_code == 202
        config = client.get("/api/config").json()
        assert config["values"]["model"] == MODEL_ID and "model" in config["user_keys"]
        assert wait_until(client, lambda found: found["state"] == "ready")["state"] == "ready"
