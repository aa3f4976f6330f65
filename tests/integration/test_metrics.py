"""`/metrics` and the health probes (issue 47), in process on the default GGUF: the
exposition parses with prometheus-client's own parser, every counter moves exactly with a
known load, the gauges come back to idle, and both probes answer as Kubernetes reads them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, LocalClient, cache_dir
from tests.events import DONE_KEYS, data_of

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
JSON_REQUESTS, STREAMED = 3, 2
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(client: TestClient, path: str = "/metrics") -> Samples:
    """Every sample of the exposition, by name and labels, read by prometheus-client's parser."""
    response = client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def ask(content: str, **extra: Any) -> dict[str, Any]:
    body = {"model": GGUF_ID, "messages": [{"role": "user", "content": content}]}
    return {**body, "temperature": 0, "max_tokens": 8, **extra}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server that loads nothing until asked (so its readiness starts `empty`)."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("metrics"), cache_dir=cache_dir(), threads=ENGINE_THREADS
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


def test_health_probes(fresh: TestClient) -> None:
    """Issue 47 item 2: /health is 200 while the process serves; /health/ready is 503 `empty`
    until a model is loaded, then 200 `ready` naming it; both at /v1 too."""
    for path in ("/health", "/v1/health"):
        alive = fresh.get(path)
        assert alive.status_code == 200 and alive.json() == {"status": "alive"}
    empty = fresh.get("/health/ready")
    assert empty.status_code == 503
    assert empty.json() == {"status": "empty", "model": None, "error": ""}
    assert fresh.post(CHAT, json=ask("Hi", max_tokens=1)).status_code == 200
    for path in ("/health/ready", "/v1/health/ready"):
        ready = fresh.get(path)
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "model": GGUF_ID, "error": ""}


def test_counters_move_with_a_known_load(fresh: TestClient) -> None:
    """Issue 47 item 1: after N JSON and M streamed requests and refusals, every vLLM counter
    equals what was sent and billed, each histogram counted each request (and each token
    after a choice's first), and the gauges are back to idle."""
    before = samples(fresh)
    prompt = completion = cached = 0
    reasons: dict[str, int] = {}
    for i in range(JSON_REQUESTS):
        body = fresh.post(CHAT, json=ask(f"Count to {i + 3}.")).json()
        usage = body["usage"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reason = body["choices"][0]["finish_reason"]
        reasons[reason] = reasons.get(reason, 0) + 1
    for i in range(STREAMED):
        payload = ask(f"Name {i + 2} colours.", stream=True, stream_options={"include_usage": True})
        with fresh.stream("POST", CHAT, json=payload) as response:
            chunks = [
                json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
            ]
        usage = chunks[-1]["usage"]
        prompt += usage["prompt_tokens"]
        completion += usage["completion_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reason = next(
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        )
        reasons[reason] = reasons.get(reason, 0) + 1
    refused = fresh.post(CHAT, json=ask("Hi", max_tokens=-1))
    assert refused.status_code == 400
    unknown = fresh.post(CHAT, json=ask("Hi", model="no-such-model"))
    assert unknown.status_code == 404
    after = samples(fresh)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, model_name=GGUF_ID, **labels) - value(
            before, name, model_name=GGUF_ID, **labels
        )

    requests = JSON_REQUESTS + STREAMED
    assert moved("vllm:prompt_tokens_total") == prompt
    assert moved("vllm:generation_tokens_total") == completion
    assert moved("vllm:prefix_cache_queries_total") == prompt
    assert moved("vllm:prefix_cache_hits_total") == cached
    for reason, count in reasons.items():
        assert moved("vllm:request_success_total", finished_reason=reason) == count
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
    ):
        assert moved(name) == requests, name
    assert moved("vllm:request_prompt_tokens_sum") == prompt
    assert moved("vllm:request_generation_tokens_sum") == completion
    assert moved("vllm:inter_token_latency_seconds_count") == completion - requests
    assert moved("vllm:time_per_output_token_seconds_count") == completion - requests
    for code, count in (("invalid_parameter", 1), ("model_not_found", 1)):
        was = value(before, "miserver_refusals_total", code=code)
        assert value(after, "miserver_refusals_total", code=code) - was == count, code
    assert value(after, "vllm:num_requests_running", model_name=GGUF_ID) == 0
    assert value(after, "vllm:num_requests_waiting", model_name=GGUF_ID) == 0
    assert value(after, "vllm:kv_cache_usage_perc", model_name=GGUF_ID) == 0
    assert value(after, "vllm:gpu_cache_usage_perc", model_name=GGUF_ID) == 0


def test_metrics_under_the_security_model(tmp_path: Path) -> None:
    """Issue 47 item 1: /metrics (and the probes) need the API key where one is set, and a
    loopback server refuses a foreign Host, as every /v1 path."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), threads=ENGINE_THREADS, api_key="k-123"
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        for path in ("/metrics", "/v1/metrics", "/health"):
            assert client.get(path).status_code == 401, path
            keyed = client.get(path, headers={"Authorization": "Bearer k-123"})
            assert keyed.status_code == 200, path
        foreign = client.get("/metrics", headers={"Host": "evil.example"})
        assert foreign.status_code == 403


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_reply_carries_its_timings_and_run_summary(fresh: TestClient, path: str) -> None:
    """Issue 47 item 4, LOC-CHAT-71 (contract 0.27.0): a reply's `timings` use llama.cpp's
    names: `prompt_n` the tokens run and `cache_n` those the KV held, `predicted_n` the
    generated tokens; queue, prompt and decode add up to the request's wall time within 5%;
    `millm_summary` holds the `done` event's keys for the choice."""
    body = ask("Count slowly from one to forty.", max_tokens=64, ignore_eos=True)
    if path == "/v1/completions":
        body = {**body, "prompt": "Count slowly from one to forty:"}
        del body["messages"]
    fresh.post(path, json=body)  # loads the model: the next is timed warm
    started = time.perf_counter()
    response = fresh.post(path, json=body)
    wall_ms = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.text
    reply = response.json()
    usage, timings = reply["usage"], reply["timings"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert (timings["cache_n"], timings["prompt_n"]) == (cached, usage["prompt_tokens"] - cached)
    assert timings["predicted_n"] == usage["completion_tokens"] == 64
    spans = timings["queue_ms"] + timings["prompt_ms"] + timings["predicted_ms"]
    assert spans == pytest.approx(wall_ms, rel=0.05)
    assert timings["predicted_per_second"] == pytest.approx(
        63 / timings["predicted_ms"] * 1000, rel=1e-6
    )
    summary = reply["millm_summary"]
    assert set(summary) >= DONE_KEYS
    assert (summary["tokens"], summary["cancelled"]) == (64, False)
    assert summary["n_prompt"] == usage["prompt_tokens"]


def test_a_streams_last_choice_chunk_carries_them(fresh: TestClient) -> None:
    """Issue 47 item 4, LOC-CHAT-64 (contract 0.27.0): the last choice chunk of a stream (its
    finish chunk) carries `timings` and `millm_summary`; no other chunk does."""
    body = ask("Name three colours.", max_tokens=12, stream=True)
    with fresh.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = [c for c in data_of(list(response.iter_lines())) if isinstance(c, dict)]
    carrying = [c for c in chunks if "timings" in c or "millm_summary" in c]
    assert len(carrying) == 1
    [last] = carrying
    assert last["choices"] and last["choices"][0]["finish_reason"] is not None
    assert last["timings"]["predicted_n"] == last["millm_summary"]["tokens"]
    assert set(last["millm_summary"]) >= DONE_KEYS


def test_metrics_off(tmp_path: Path) -> None:
    """Issue 47 (contract 0.28.0): a server started with --no-metrics answers 404 `not_found`
    on /metrics in OpenAI's error shape, naming the setting, and moves no counter; its
    replies keep their `timings` and run summary, and its refusals are still answered."""
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), threads=ENGINE_THREADS, no_metrics=True
    )
    server = Server(settings, preload=False)
    with LocalClient(server, raise_server_exceptions=False) as client:
        reply = client.post(CHAT, json=ask("Hi", max_tokens=4))
        assert reply.status_code == 200, reply.text
        assert reply.json()["timings"]["predicted_n"] == reply.json()["usage"]["completion_tokens"]
        assert set(reply.json()["millm_summary"]) >= DONE_KEYS
        assert client.post(CHAT, json=ask("Hi", max_tokens=-1)).status_code == 400
        for path in ("/metrics", "/v1/metrics"):
            off = client.get(path)
            assert off.status_code == 404, path
            error = off.json()["error"]
            assert error["code"] == "not_found" and "--no-metrics" in error["message"]
        assert list(server.state.metrics.registry.collect()) == []
