"""The models directory: listing, and loading a named model first."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.transformers.conversion import cached_hf_folder
from miserver.settings import Settings
from tests.conftest import MODEL_ID, LocalClient, cache_dir

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def models_dir(tmp_path: Path, gguf_path: Path) -> Path:
    """A models dir with an HF folder (`smol-hf`) and a GGUF file (`Other.Q4_1.gguf`)."""
    folder = cached_hf_folder(gguf_path, cache_dir(), lambda _msg: None)
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol-hf").symlink_to(folder, target_is_directory=True)
    (models / "Other.Q4_1.gguf").symlink_to(gguf_path)
    (models / "notes.txt").write_text("not a model")
    return models


def test_models_dir_is_listed_and_a_named_model_loads_first(
    tmp_path: Path, models_dir: Path
) -> None:
    """OAI-MODELS-01, OAI-MODELS-03, OAI-ERR-30: every model listed; naming one loads it first."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), models_dir=models_dir, model=MODEL_ID
    )
    server = Server(settings, preload=False)
    with LocalClient(server) as client:
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert ids == [f"{MODEL_ID}:Q4_1", MODEL_ID, "Other:Q4_1", "smol-hf"]
        body = {"model": "smol-hf", "messages": USER, "temperature": 0, "max_tokens": 4}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["X-miLLM-Model"] == "smol-hf"
        assert response.json()["model"] == "smol-hf"
        resident = server.state.manager.resident
        assert resident is not None and resident.entry.model_id == "smol-hf"
        again = client.post("/v1/chat/completions", json={**body, "model": MODEL_ID})
        assert again.json()["choices"] == response.json()["choices"]
        resident = server.state.manager.resident
        assert resident is not None and resident.entry.model_id == MODEL_ID


def test_unused_fields_are_logged_once_without_values(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """OAI-VALID-07: exactly one request_fields_unused warning, locations and never values."""
    body = {
        "model": MODEL_ID,
        "messages": USER,
        "max_tokens": 1,
        "user": "secret-user-id",
        "foo": "secret-value",
    }
    with caplog.at_level(logging.WARNING):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    records = [r for r in caplog.records if "request_fields_unused" in r.getMessage()]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "user" in message and "foo" in message and "secret" not in message


def test_a_model_lock_lists_only_it_refuses_others_and_survives_a_restart(
    tmp_path: Path, models_dir: Path
) -> None:
    """OAI-MODELS-05, issue 19 item 5: locked to one model, /v1/models lists only it; a chat,
    an embedding, a model lookup or a load naming another model is 409 model_locked naming
    the lock, before anything loads; the lock survives a restart and lifts on DELETE."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), models_dir=models_dir, model=MODEL_ID
    )
    json_type = {"Content-Type": "application/json"}
    with LocalClient(Server(settings, preload=False)) as client:
        assert client.get("/api/steering/lock").json() == {"locked": False, "model": None}
        unknown = client.put("/api/steering/lock", json={"model": "no-such-model"})
        assert unknown.status_code == 404
        locked = client.put("/api/steering/lock", json={"model": "Other:Q4_1"})
        assert locked.json() == {"locked": True, "model": "Other:Q4_1"}
    server = Server(settings, preload=False)
    with LocalClient(server) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["Other:Q4_1"]
        body = {"model": "smol-hf", "messages": USER, "temperature": 0, "max_tokens": 2}
        refusals = [
            client.post("/v1/chat/completions", json=body),
            client.post("/v1/completions", json={"model": MODEL_ID, "prompt": "Hi"}),
            client.post("/v1/embeddings", json={"model": MODEL_ID, "input": "Hi"}),
            client.get("/v1/models/smol-hf"),
            client.post("/api/session/load", json={"model": "smol-hf"}, headers=json_type),
        ]
        for refused in refusals:
            error = refused.json()["error"]
            assert (refused.status_code, error["code"], error["param"]) == (
                409,
                "model_locked",
                "model",
            ), refused.text
            assert "Other:Q4_1" in error["message"]
        assert server.state.manager.resident is None
        served = client.post("/v1/chat/completions", json={**body, "model": "Other:Q4_1"})
        assert served.status_code == 200 and served.json()["model"] == "Other:Q4_1"
        lifted = client.delete("/api/steering/lock", headers=json_type)
        assert lifted.json() == {"locked": False, "model": None}
        assert len(client.get("/v1/models").json()["data"]) == 4
