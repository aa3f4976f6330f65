"""The prompt cache through the server as it starts by default (issue 43): batching on
(`parallel: auto`, 4 rows) and `cache-ram: auto`. A chat seen before is restored after 20
other chats pushed its KV out of every row, and says so in
`usage.prompt_tokens_details.cached_tokens` and in `GET /api/health/inference`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import GGUF_ID, MODEL_ID, LocalClient, cache_dir
from tests.local_api import load
from tools.bench.scoring_cache import context

pytestmark = pytest.mark.model

SYSTEM = "You answer questions about ancient history for a museum's visitors. " * 8


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    scoring = replace(settings, scoring_cache=True)  # scoring on the cache too (issue 43)
    with LocalClient(Server(scoring, preload=False), raise_server_exceptions=False) as client:
        load(client, GGUF_ID)
        yield client


def chat(client: TestClient, system: str, question: str) -> dict[str, Any]:
    body = {
        "model": GGUF_ID,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
        "temperature": 0,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return cast(dict[str, Any], response.json())


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_chat_is_restored_after_twenty_others(client: TestClient) -> None:
    """Issue 43: the first chat prefills cold; 20 chats on other subjects go through the
    batch's rows; the first again finds all but its last token cached (restored from host
    memory: no row held it any more), and the health route counts the hit and the bytes
    the cache holds."""
    first = chat(client, SYSTEM, "Who founded Rome?")
    assert cached(first) < 16  # at most the template's head
    for k in range(20):
        chat(client, f"You are assistant number {k}, terse and exact.", f"What is {k} + {k}?")
    again = chat(client, SYSTEM, "Who founded Rome?")
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    stats = client.get("/api/health/inference").json()["prompt_cache"]
    assert stats["hits"] >= 1 and stats["tokens_restored"] >= cached(again) - 16
    assert 0 < stats["bytes"] <= stats["budget_bytes"]


FEW_SHOT = context(6)  # the benchmark's few-shot context: six question-answer pairs


def score(client: TestClient, model: str, prompt: str) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "logprobs": 5, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return cast(dict[str, Any], response.json())


def top(reply: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = reply["choices"][0]["logprobs"]["top_logprobs"][0]
    return found


# a restored prefix against a cold prefill: float rounding on transformers; llama.cpp's
# batch-shape noise on Q4_1 (tools/bench/scoring_cache.py: 0.07 nats at the median of a
# 16-shot run's top tokens, 0.41 at most)
COLD_TOLERANCE = {GGUF_ID: 0.5, MODEL_ID: 1e-3}


@pytest.mark.parametrize("model", [GGUF_ID, MODEL_ID])
def test_scoring_reuses_a_few_shot_context(client: TestClient, model: str) -> None:
    """Issue 43 ("scoring requests use it too"), with `--scoring-cache`: an evaluation
    scores the same few-shot context with one question after another. The first prefills
    cold; after other prompts pushed it out of the KV, the next question finds the whole
    shared context cached (held or restored from host memory), says so in
    `cached_tokens`, and the same question scored again gives the cold pass's
    log-probabilities within `COLD_TOLERANCE` (the prefix's keys and values were computed
    in another pass)."""
    if model != GGUF_ID:
        load(client, model)
    cold = score(client, model, FEW_SHOT + "Q: What is the capital of Chile?\nA:")
    assert cached(cold) < 16
    for k in range(5):
        score(client, model, f"Unrelated text number {k}: the quick brown fox jumps over it.")
    other = score(client, model, FEW_SHOT + "Q: What is the capital of Spain?\nA:")
    shared = len(FEW_SHOT) // 8  # well inside the context's tokens
    assert cached(other) > shared
    again = score(client, model, FEW_SHOT + "Q: What is the capital of Chile?\nA:")
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    assert set(top(again)) == set(top(cold))
    for token, logprob in top(cold).items():
        assert top(again)[token] == pytest.approx(logprob, abs=COLD_TOLERANCE[model])


def test_scoring_without_the_cache_is_exact(tmp_path: Path) -> None:
    """Issue 43, `--scoring-cache` off (the default): every prompt is scored whole, nothing
    reported cached, and the same prompt scores bit for bit the same whatever came before."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=GGUF_ID)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        prompt = FEW_SHOT + "Q: What is the capital of Chile?\nA:"
        cold = score(client, GGUF_ID, prompt)
        score(client, GGUF_ID, FEW_SHOT + "Q: What is the capital of Spain?\nA:")
        again = score(client, GGUF_ID, prompt)
    assert cached(cold) == cached(again) == 0
    assert top(again) == top(cold)
