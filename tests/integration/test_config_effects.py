"""What the config changes: request defaults and the next load's settings (docs/LOCAL.md).

Request-scoped parameters (LOC-CONC-07) are the defaults of the fields a
request leaves out; session-scoped ones (LOC-CONC-08..10) take effect at the
next load. Real models: the embedded GGUF on llama.cpp and its transformers
conversion.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.cores import usable_cores
from miserver.settings import Settings
from tests.conftest import GGUF_ID, JSON, MODEL_ID, LocalClient
from tests.local_api import configure, load, wait_until

STORY = [{"role": "user", "content": "Tell me a long story about a dragon."}]


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


def chat(client: TestClient, model: str = GGUF_ID, **fields: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/chat/completions", json={"model": model, "messages": STORY, **fields}, headers=JSON
    )
    assert response.status_code == 200, response.text
    return cast(dict[str, Any], response.json())


def text(reply: dict[str, Any]) -> str:
    return cast(str, reply["choices"][0]["message"]["content"])


def greedy(client: TestClient, model: str = GGUF_ID) -> str:
    """The greedy reply with the prompt already cached: llama.cpp's first token after a
    cold prefill can differ from one after a cache hit (its batch shapes differ), so the
    reference is taken warm, as every later request is."""
    chat(client, model, temperature=0, max_tokens=1)
    return text(chat(client, model, temperature=0, max_tokens=24))


# -- the ceiling (LOC-CHAT-21..25, LOC-SEC-41/42) -----------------------------------------


def test_n_predict_is_the_ceiling_a_request_leaves_out(client: TestClient) -> None:
    """LOC-CHAT-21, -22, -27, LOC-CONC-07: absent, null or 0 is n-predict, applied to the
    next message with no reload; a request's own ceiling wins."""
    configure(client, **{"n-predict": 4})
    for fields in ({}, {"max_tokens": None}, {"max_tokens": 0}, {"max_completion_tokens": 0}):
        reply = chat(client, temperature=0, **fields)
        assert reply["usage"]["completion_tokens"] == 4, fields
        assert reply["choices"][0]["finish_reason"] == "length"
    assert chat(client, temperature=0, max_tokens=6)["usage"]["completion_tokens"] == 6


def test_a_ceiling_past_n_predict_max_is_clamped(client: TestClient) -> None:
    """LOC-SEC-41, LOC-CHAT-23: 40,000 is clamped to n-predict's max (32,768), which this
    model's window (8,192) still refuses as OAI-ERR-04 says, naming the clamped ceiling."""
    cap = {r["key"]: r for r in client.get("/api/params").json()}["n-predict"]["max"]
    response = client.post(
        "/v1/chat/completions",
        json={"model": GGUF_ID, "messages": STORY, "max_tokens": 40000},
        headers=JSON,
    )
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert f"{cap} for the completion" in error["message"]


@pytest.mark.parametrize(
    "value",
    [-1, 1.5, 5.0, "8", True],
    ids=["LOC-CHAT-24", "LOC-CHAT-25-fraction", "open-point-38", "LOC-CHAT-25-string", "bool"],
)
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_ceiling_that_is_no_non_negative_integer_is_refused(
    bare_client: TestClient, field: str, value: Any
) -> None:
    """LOC-SEC-42, LOC-CHAT-24, -25: only a JSON integer >= 0 is a ceiling."""
    response = bare_client.post(
        "/v1/chat/completions",
        json={"model": GGUF_ID, "messages": STORY, field: value},
        headers=JSON,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field


# -- sampling defaults (LOC-CHAT-34, adapted) ---------------------------------------------


def test_temp_is_the_default_temperature(client: TestClient) -> None:
    """LOC-CHAT-34: with `temp` 0, a request that sends no temperature is greedy; one that
    sends its own is not overruled."""
    sampled = text(chat(client, MODEL_ID, temperature=1.0, seed=3, max_tokens=24))
    reference = greedy(client)
    configure(client, temp=0.0)
    assert text(chat(client, max_tokens=24)) == reference
    assert text(chat(client, max_tokens=24)) == reference
    assert text(chat(client, MODEL_ID, temperature=1.0, seed=3, max_tokens=24)) == sampled
    assert sampled != text(chat(client, MODEL_ID, temperature=0, max_tokens=24))


@pytest.mark.parametrize("model", [GGUF_ID, MODEL_ID], ids=["llama.cpp", "transformers"])
def test_top_k_one_is_greedy(client: TestClient, model: str) -> None:
    """LOC-CHAT-34: `top-k` reaches both engines' samplers; k = 1 keeps only the most likely
    token, so sampling at temperature 1 gives the greedy text."""
    reference = greedy(client, model)
    configure(client, **{"top-k": 1})
    assert text(chat(client, model, temperature=1.0, max_tokens=24)) == reference


def test_seed_is_the_default_seed_where_seeds_are_honoured(client: TestClient) -> None:
    """LOC-CHAT-34, OAI-SEED-04/05: a configured seed seeds requests that send none, echoed as
    theirs, on both engines; a request's own seed wins."""
    own = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": STORY, "max_tokens": 16, "seed": 7},
        headers=JSON,
    )
    configure(client, seed=7)
    first = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": STORY, "max_tokens": 16},
        headers=JSON,
    )
    assert first.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert text(first.json()) == text(own.json())
    other = client.post(
        "/v1/chat/completions",
        json={"model": MODEL_ID, "messages": STORY, "max_tokens": 16, "seed": 8},
        headers=JSON,
    )
    assert other.headers["X-miLLM-Seed"] == '8;scope="request"'
    gguf = [
        client.post(
            "/v1/chat/completions",
            json={"model": GGUF_ID, "messages": STORY, "max_tokens": 16, **seed},
            headers=JSON,
        )
        for seed in ({}, {}, {"seed": 7})
    ]
    assert [r.headers["X-miLLM-Seed"] for r in gguf] == ['7;scope="request"'] * 3
    assert text(gguf[0].json()) == text(gguf[1].json()) == text(gguf[2].json())


# -- session parameters (LOC-CONC-08..10) ---------------------------------------------------


def test_session_parameters_shape_the_next_load_on_llama_cpp(client: TestClient) -> None:
    """LOC-CONC-08, -09, -10, LOC-INFO-17: threads and ctx-size reach llama.cpp at the next
    load; changing them while loaded marks reload_required and changes nothing yet."""
    configure(client, threads=1, **{"ctx-size": 512, "batch-size": 64, "mmap": False})
    info = load(client, GGUF_ID)
    assert info["model"]["n_ctx"] == 512 and info["model"]["compute_threads"] == 1
    response = client.post(
        "/v1/chat/completions",
        json={"model": GGUF_ID, "messages": STORY, "max_tokens": 600},
        headers=JSON,
    )
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert configure(client, threads=2)["reload_required"] is True
    assert client.get("/api/info").json()["model"]["compute_threads"] == 1
    assert load(client, GGUF_ID)["model"]["compute_threads"] == 1  # already resident
    assert client.post("/api/session/unload", headers=JSON).status_code == 200
    assert load(client, GGUF_ID)["model"]["compute_threads"] == 2
    assert client.get("/api/config").json()["reload_required"] is False


@pytest.mark.parametrize("model", [GGUF_ID, MODEL_ID], ids=["llama.cpp", "transformers"])
def test_threads_auto_uses_the_usable_physical_cores(client: TestClient, model: str) -> None:
    """LOC-INFO-17, LOC-CONC-10 (issue 23 item 1): `threads` auto loads with one thread per
    physical core the process may use, on both engines, and /api/info says so."""
    configure(client, threads="auto")
    info = load(client, model)
    assert info["model"]["compute_threads"] == usable_cores()
    assert info["model"]["busy_threads"] == usable_cores()


def test_session_parameters_shape_the_next_load_on_transformers(client: TestClient) -> None:
    """LOC-CONC-10: ctx-size and dtype reach transformers; the fingerprint names the dtype."""
    configure(client, dtype="bfloat16", **{"ctx-size": 1000})
    info = load(client, MODEL_ID)
    assert info["model"]["n_ctx"] == 1000
    reply = chat(client, MODEL_ID, temperature=0, max_tokens=2)
    assert ":bfloat16/" in reply["system_fingerprint"]


def test_engine_picks_the_engine_for_a_model_file(client: TestClient) -> None:
    """LOC-PARAMS-21 (adapted): `engine` transformers serves the launch GGUF's conversion."""
    configure(client, engine="transformers", model=GGUF_ID)
    assert client.post("/api/session/load", headers=JSON).status_code == 202
    info = wait_until(client, lambda found: found["state"] in ("ready", "error"))
    assert info["model"]["engine"] == "transformers" and info["model"]["id"] == MODEL_ID


def test_decide_off_refuses_every_decision(client: TestClient) -> None:
    """LOC-DECIDE-23, -24, LOC-CONC-08: `decide` is on by default; loaded with it off,
    every decision is refused until a reload turns it back on."""
    body = {"prefix": "Is the sky blue? Answer:", "suffix": "", "choices": [" yes", " no"]}
    configure(client, decide=False)
    load(client, GGUF_ID)
    refused = client.post("/api/decide", json=body, headers=JSON)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request"
    assert configure(client, decide=True)["reload_required"] is True
    assert client.post("/api/decide", json=body, headers=JSON).status_code == 400
    client.post("/api/session/unload", headers=JSON)
    load(client, GGUF_ID)
    assert client.post("/api/decide", json=body, headers=JSON).status_code == 200
