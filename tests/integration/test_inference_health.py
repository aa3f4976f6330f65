"""GET /api/health/inference: which backend serves generations, the slot's occupancy
(OAI-CBM-14) and the prompt cache (issue 43). Continuous batching is on by default
(`parallel: auto`, issue 43, superseding OAI-CBM-01's opt-in) and `parallel` 1 keeps the
serial path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.generated import api
from miserver.settings import Settings
from tests.conftest import GGUF_ID, JSON, MODEL_ID, LocalClient
from tests.local_api import configure, load

FIELDS = {
    "backend",
    "parallel",
    "slots_in_use",
    "queue_length",
    "model",
    "device",
    "prompt_cache",
}
EMPTY_CACHE = {"entries": 0, "bytes": 0, "hits": 0, "misses": 0, "tokens_restored": 0, "evicted": 0}


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """A server of its own, nothing loaded at start."""
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


def health(client: TestClient) -> dict[str, Any]:
    """The body, checked against the contract's `InferenceHealth` (no other field)."""
    response = client.get("/api/health/inference")
    assert response.status_code == 200, response.text
    body = cast(dict[str, Any], response.json())
    assert set(body) == FIELDS
    api.InferenceHealth.model_validate(body)
    return body


def test_no_model_resident_is_serial(client: TestClient) -> None:
    """OAI-CBM-14: with no model resident the backend is `serial`, one row, nothing holding
    or waiting for the slot, `model` null."""
    assert health(client) == {
        "backend": "serial",
        "parallel": 1,
        "slots_in_use": 0,
        "queue_length": 0,
        "model": None,
        "device": None,
        "prompt_cache": None,
    }


def test_a_held_slot_and_a_waiter_are_counted(client: TestClient) -> None:
    """OAI-CBM-14: `slots_in_use` counts the request holding the slot and `queue_length` the
    one waiting behind it; both fall back to 0 when they leave."""
    server = cast(Server, client.app)
    scheduler = server.state.scheduler
    portal = client.portal
    assert portal is not None
    holder = portal.call(scheduler.enter)
    waiter = portal.call(scheduler.enter)
    try:
        found = health(client)
        assert (found["slots_in_use"], found["queue_length"]) == (1, 1)
        assert found["backend"] == "serial"
    finally:
        portal.call(scheduler.leave, waiter)
        portal.call(scheduler.leave, holder)
    found = health(client)
    assert (found["slots_in_use"], found["queue_length"]) == (0, 0)


@pytest.mark.model
def test_the_default_model_loads_batched_with_a_prompt_cache(client: TestClient) -> None:
    """OAI-CBM-14, issue 43 (batching on by default, superseding OAI-CBM-01's opt-in):
    with `parallel` and `cache-ram` left at auto the GGUF model (an 8192-token window)
    loads `continuous_batching` with 4 rows of 2048 tokens, and an empty prompt cache
    with a budget; after an unload `model` and `prompt_cache` are null again."""
    load(client, GGUF_ID)
    found = health(client)
    cache = found.pop("prompt_cache")
    assert found == {
        "backend": "continuous_batching",
        "parallel": 4,
        "slots_in_use": 0,
        "queue_length": 0,
        "model": GGUF_ID,
        "device": "cpu",
    }
    assert {k: v for k, v in cache.items() if k != "budget_bytes"} == EMPTY_CACHE
    assert cache["budget_bytes"] > 0
    assert client.post("/api/session/unload", headers=JSON).status_code == 200
    assert (health(client)["model"], health(client)["prompt_cache"]) == (None, None)


@pytest.mark.model
def test_parallel_1_and_cache_ram_0_load_serial_with_no_cache(client: TestClient) -> None:
    """OAI-CBM-14, issue 43: `parallel` 1 keeps the serial path, and `cache-ram` 0 turns
    the prompt cache off (`prompt_cache` null)."""
    configure(client, parallel=1, **{"cache-ram": 0})
    load(client, GGUF_ID)
    found = health(client)
    assert (found["backend"], found["parallel"], found["prompt_cache"]) == ("serial", 1, None)


@pytest.mark.model
def test_parallel_4_loads_continuous_batching_on_llama_cpp(client: TestClient) -> None:
    """OAI-CBM-14: `parallel` 4 set over PUT /api/config applies at the next load, even on a
    512-token window (auto would load it serial): the GGUF model then runs
    `continuous_batching` with 4 rows. The backend shown is
    the loaded model's, so setting `parallel` back to 1 changes nothing until a reload."""
    configure(client, parallel=4, **{"ctx-size": 512})
    assert health(client)["backend"] == "serial"  # nothing loaded yet
    load(client, GGUF_ID)
    found = health(client)
    assert (found["backend"], found["parallel"], found["model"]) == (
        "continuous_batching",
        4,
        GGUF_ID,
    )
    assert found["device"] == "cpu"  # contract 0.29.0: the PyPI wheel offloads nothing
    assert configure(client, parallel=1)["reload_required"] is True
    assert health(client)["backend"] == "continuous_batching"
    assert client.post("/api/session/unload", headers=JSON).status_code == 200
    load(client, GGUF_ID)
    assert (health(client)["backend"], health(client)["parallel"]) == ("serial", 1)


@pytest.mark.model
def test_parallel_4_loads_continuous_batching_on_transformers(client: TestClient) -> None:
    """OAI-CBM-14: the transformers engine batches too: with `parallel` 4 it loads
    `continuous_batching` with 4 rows, and with 1 it loads `serial`; it keeps no prompt
    cache yet (`prompt_cache` null)."""
    configure(client, parallel=4)
    load(client, MODEL_ID)
    found = health(client)
    assert (found["backend"], found["parallel"], found["model"]) == (
        "continuous_batching",
        4,
        MODEL_ID,
    )
    assert found["device"] == "cpu"  # contract 0.29.0: `device` auto, no CUDA here
    configure(client, parallel=1)
    assert client.post("/api/session/unload", headers=JSON).status_code == 200
    load(client, MODEL_ID)
    assert (health(client)["backend"], health(client)["parallel"]) == ("serial", 1)


def test_a_full_queue_refuses_before_reading_the_body(bare_client: TestClient) -> None:
    """OAI-ERR-09, issue 17 (backpressure that keeps serving): while the queue is full, a
    request that would wait is refused 503 queue_full with Retry-After before its body is
    parsed (a body that is not even JSON gets the 503, not a 400); other routes still
    answer, and once a place frees the same routes parse again."""
    client = bare_client
    scheduler = client.app.state.scheduler  # type: ignore[attr-defined]
    holder = client.portal.call(scheduler.enter)  # type: ignore[union-attr]
    places = client.app.settings.queue_max_waiting  # type: ignore[attr-defined]
    waiters = [client.portal.call(scheduler.enter) for _ in range(places)]  # type: ignore[union-attr]
    try:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            refused = client.post(path, content=b"{not json", headers=JSON)
            assert refused.status_code == 503, path
            assert refused.json()["error"]["code"] == "queue_full"
            assert refused.headers["Retry-After"]
        assert client.get("/api/health/inference").json()["queue_length"] == places
    finally:
        for ticket in [*waiters, holder]:
            client.portal.call(scheduler.leave, ticket)  # type: ignore[union-attr]
    after = client.post("/v1/chat/completions", content=b"{not json", headers=JSON)
    assert after.status_code == 400 and after.json()["error"]["code"] == "invalid_json"
