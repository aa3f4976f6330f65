"""Model lifecycle: GGUF naming, refusals before any load, switching, busy, failures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import gguf as gguf_lib
import httpx
import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.transformers.conversion import cached_hf_folder
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, LOCAL_URL, MODEL_ID, LocalClient, cache_dir
from tests.models import header_only_gguf

USER = [{"role": "user", "content": "Hi"}]


def hf_clone(source: Path, target: Path, **config_changes: Any) -> Path:
    """An HF folder of links to `source`'s files, with config.json edited."""
    target.mkdir()
    for item in source.iterdir():
        if item.name != "config.json":
            (target / item.name).symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **config_changes}))
    return target


@pytest.fixture
def models_dir(tmp_path: Path, gguf_path: Path) -> Path:
    folder = cached_hf_folder(gguf_path, cache_dir(), lambda _msg: None)
    models = tmp_path / "models"
    models.mkdir()
    (models / "Other.Q4_1.gguf").symlink_to(gguf_path)
    (models / "Twin.Q4_1.gguf").symlink_to(gguf_path)
    header_only_gguf(models / "Twin.Q8_0.gguf", gguf_lib.LlamaFileType.MOSTLY_Q8_0)
    (models / "smol-hf").symlink_to(folder, target_is_directory=True)
    hf_clone(
        folder,
        models / "smol-bnb",
        quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True},
    )
    huge = hf_clone(folder, models / "smol-huge")
    (huge / "model.safetensors").unlink()
    with (huge / "model.safetensors").open("wb") as handle:
        handle.truncate(64 << 30)  # a sparse 64 GiB weight file
    with gguf_path.open("rb") as source:  # a valid header, the weights cut off
        (models / "Cut.Q4_1.gguf").write_bytes(source.read(4 << 20))
    broken = hf_clone(folder, models / "smol-broken")
    (broken / "model.safetensors").unlink()
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    return models


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": USER, "max_tokens": 4, "temperature": 0, **extra}


def resident(server: Server) -> str | None:
    found = server.state.manager.resident
    return found.entry.model_id if found else None


def test_gguf_names_and_bare_repository_refusals(tmp_path: Path, models_dir: Path) -> None:
    """OAI-GGUF-02..06, OAI-MODELS-06, OAI-ERR-25: repo:QUANT ids; bare names refused, no load."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "d",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models_dir,
    )
    with LocalClient(Server(settings, preload=False)) as client:
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert {GGUF_ID, MODEL_ID, "Other:Q4_1", "Twin:Q4_1", "Twin:Q8_0"} <= set(ids)
        one = client.post("/v1/chat/completions", json=chat("Other")).json()["error"]
        assert one["code"] == "model_not_found" and "Other:Q4_1" in one["message"]
        two = client.post("/v1/chat/completions", json=chat("Twin"))
        assert two.status_code == 400
        error = two.json()["error"]
        assert error["code"] == "AMBIGUOUS_MODEL_NAME" and error["param"] == "model"
        assert "Twin:Q4_1" in error["message"] and "Twin:Q8_0" in error["message"]
        assert client.app.state.manager.resident is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("field", "value"),
    [("extra_messages", [USER])],
    ids=["OAI-VALID-17-extra_messages"],
)
def test_gguf_column_refusals_come_before_any_load(
    bare_client: TestClient, field: str, value: Any
) -> None:
    """OAI-VALID-15, OAI-VALID-16, OAI-GGUF-01: GGUF refusals with field_not_honoured, no load.
    (`logprobs`, `top_logprobs` and `allowed_token_ids` are served on GGUF since contract
    0.17.0: OAI-SCORE-21 and OAI-VALID-17's GGUF refusal are superseded; `steering`,
    `profile` and `steering_intensity` since contract 0.25.0: OAI-INL-24 and OAI-VALID-23's
    are; `return_sae_activations` since contract 0.26.0: OAI-ACT-24's is,
    docs/DECISIONS.md.)"""
    response = bare_client.post("/v1/chat/completions", json=chat(GGUF_ID, **{field: value}))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "field_not_honoured"
    assert response.json()["error"]["param"] == field
    assert bare_client.app.state.manager.resident is None  # type: ignore[attr-defined]


def test_refusals_that_keep_the_resident_model(tmp_path: Path, models_dir: Path) -> None:
    """OAI-ERR-20, OAI-ERR-21, OAI-ERR-31: checked before the unload; the resident model stays."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "d",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models_dir,
        memory_budget_mb=2048,
    )
    server = Server(settings)
    with LocalClient(server) as client:
        assert resident(server) == MODEL_ID
        quant = client.post("/v1/chat/completions", json=chat("smol-bnb"))
        assert quant.status_code == 400
        assert quant.json()["error"]["code"] == "unsupported_quantization"
        huge = client.post("/v1/chat/completions", json=chat("smol-huge"))
        assert huge.status_code == 503
        error = huge.json()["error"]
        assert error["code"] == "insufficient_memory" and error["type"] == "invalid_request_error"
        assert "MiB" in error["message"] and "Nothing was unloaded" in error["message"]
        assert resident(server) == MODEL_ID
        assert client.post("/v1/chat/completions", json=chat(MODEL_ID)).status_code == 200


def test_a_failed_load_is_a_500_and_the_next_request_recovers(
    tmp_path: Path, models_dir: Path
) -> None:
    """OAI-ERR-22, OAI-ERR-32, OAI-MODELS-04, OAI-GGUF-01: model_load_failed; FAILED hidden.

    A corrupt HF folder and a cut-off GGUF in the models dir both fail after the
    unload; the next request (GGUF on llama.cpp, then transformers) loads fine.
    """
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "d",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models_dir,
    )
    server = Server(settings)
    with LocalClient(server) as client:
        failed = client.post("/v1/chat/completions", json=chat("smol-broken"))
        assert failed.status_code == 500
        assert failed.json()["error"]["code"] == "model_load_failed"
        assert "Traceback" not in failed.text
        assert resident(server) is None
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert "smol-broken" not in ids
        cut = client.post("/v1/chat/completions", json=chat("Cut:Q4_1"))
        assert cut.status_code == 500 and cut.json()["error"]["code"] == "model_load_failed"
        gguf_reply = client.post("/v1/chat/completions", json=chat(GGUF_ID))
        assert gguf_reply.status_code == 200, gguf_reply.text
        assert gguf_reply.json()["system_fingerprint"].endswith(":llama.cpp")
        assert client.post("/v1/chat/completions", json=chat(MODEL_ID)).status_code == 200
        states = {m["id"]: m["state"] for m in client.get("/v1/models").json()["data"]}
        assert states[MODEL_ID] == "LOADED" and states["smol-hf"] == "READY"
        assert states[GGUF_ID] == "READY" and "Cut:Q4_1" not in states


async def _switch_scenario(server: Server, grace_halts: bool) -> dict[str, httpx.Response]:
    await server.startup()
    transport = httpx.ASGITransport(app=server)
    async with httpx.AsyncClient(transport=transport, base_url=LOCAL_URL, timeout=120) as c:
        long = chat(
            MODEL_ID,
            max_tokens=400 if grace_halts else 40,
            messages=[{"role": "user", "content": "Write a long story about the sea."}],
        )
        first = asyncio.create_task(c.post("/v1/chat/completions", json=long))
        while not server.state.scheduler.busy:
            await asyncio.sleep(0.01)
        switch = asyncio.create_task(c.post("/v1/chat/completions", json=chat("smol-hf")))
        while not server.state.manager.switching:
            await asyncio.sleep(0.01)
        busy = await c.post("/v1/chat/completions", json=chat(MODEL_ID))
        busy_stream = await c.post("/v1/chat/completions", json=chat(MODEL_ID, stream=True))
        return {
            "first": await first,
            "switch": await switch,
            "busy": busy,
            "busy_stream": busy_stream,
        }


@pytest.mark.parametrize("grace_halts", [False, True], ids=["OAI-ERR-26-waits", "halts"])
def test_a_switch_waits_for_the_running_request_and_refuses_newcomers(
    tmp_path: Path, models_dir: Path, grace_halts: bool
) -> None:
    """OAI-ERR-26, OAI-ERR-27, OAI-ERR-30: model_busy while switching, streams refused first.

    The running request finishes first; past GRACEFUL_UNLOAD_TIMEOUT it is halted (503).
    """
    grace = 0.3 if grace_halts else 60.0
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "d",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models_dir,
        graceful_unload_timeout=grace,
    )
    server = Server(settings)
    try:
        got = asyncio.run(_switch_scenario(server, grace_halts))
    finally:
        server.shutdown()
    for name in ("busy", "busy_stream"):
        assert got[name].status_code == 503, got[name].text
        error = got[name].json()["error"]
        assert error["code"] == "model_busy" and error["type"] == "server_error"
        assert got[name].headers["Retry-After"]
    if grace_halts:
        assert got["first"].status_code == 503
        assert got["first"].json()["error"]["code"] == "model_busy"
    else:
        assert got["first"].status_code == 200
        assert got["first"].json()["usage"]["completion_tokens"] > 0
    assert got["switch"].status_code == 200
    assert got["switch"].headers["X-miLLM-Model"] == "smol-hf"
