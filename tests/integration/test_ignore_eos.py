"""`ignore_eos` and `stream_options.continuous_usage_stats` over HTTP on both engines
(issue 43 item 4, contract 0.18.0; docs/DECISIONS.md, "`ignore_eos` and continuous usage").

A short answer ends at the model's end-of-turn token; with `ignore_eos` every
end-of-generation id is banned, so the same request runs to its `max_tokens` and no
reported alternative is an end token. A stream with `continuous_usage_stats` carries the
usage as it stands on every chunk; with `include_usage` alone only the last chunk does, and
with neither only the finish chunk (OAI-STREAM-05).
The transformers server is the session's `client`; the GGUF one is the module's own
(tests/integration/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.events import data_of
from tests.openai_reference import violations

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SHORT = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]
BUDGET = 40
END_TEXT = "<|im_end|>"  # SmolLM2's end of turn, its EOS


def chat(served: tuple[TestClient, str], **fields: Any) -> dict[str, Any]:
    client, model = served
    body = {"model": model, "messages": SHORT, "max_tokens": BUDGET, "temperature": 0, **fields}
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    assert violations("CreateChatCompletionResponse", reply) == []
    return reply


def test_ignore_eos_runs_to_max_tokens(served: tuple[TestClient, str]) -> None:
    """Issue 43 item 4: the answer ends at the end of turn (`stop`, fewer tokens than the
    budget); with `ignore_eos` the same greedy request starts with the same text and runs to
    `max_tokens` (`length`), and no token or reported alternative is the end token;
    `ignore_eos: false` changes nothing."""
    plain = chat(served)
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] < BUDGET
    assert chat(served, ignore_eos=False)["choices"] == plain["choices"]
    longer = chat(served, ignore_eos=True, logprobs=True, top_logprobs=5)
    choice = longer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert longer["usage"]["completion_tokens"] == BUDGET
    assert choice["message"]["content"].startswith(plain["choices"][0]["message"]["content"])
    entries = choice["logprobs"]["content"]
    assert len(entries) == BUDGET
    seen = {e["token"] for e in entries} | {a["token"] for e in entries for a in e["top_logprobs"]}
    assert END_TEXT not in seen


def test_ignore_eos_on_completions(served: tuple[TestClient, str]) -> None:
    """Issue 43 item 4: `/v1/completions` honours it too (field matrix: honoured)."""
    client, model = served
    body = {"model": model, "prompt": "Yes.", "max_tokens": 24, "temperature": 0}
    found = client.post(COMPLETIONS, json={**body, "ignore_eos": True})
    assert found.status_code == 200, found.text
    assert "x-millm-ignored-fields" not in found.headers
    assert found.json()["usage"]["completion_tokens"] == 24
    assert found.json()["choices"][0]["finish_reason"] == "length"


def streamed(served: tuple[TestClient, str], options: dict[str, Any]) -> list[dict[str, Any]]:
    client, model = served
    body = {
        "model": model,
        "messages": SHORT,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": options,
    }
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    events = data_of(response.text.splitlines())
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    for chunk in chunks:  # OpenAI's own chunk schema: its usage is nullable, any chunk's
        assert violations("CreateChatCompletionStreamResponse", chunk) == []
    return chunks


def test_continuous_usage_stats_puts_the_usage_on_every_chunk(
    served: tuple[TestClient, str],
) -> None:
    """Issue 43 item 4 (vLLM's `continuous_usage_stats`): with `include_usage`, every chunk
    carries the usage so far: the prompt's tokens on each, completion tokens that never
    fall and reach the total, which the last chunk's usage holds as without the option, and
    one cached count throughout (the role chunk goes out once the prompt has run)."""
    plain = streamed(served, {"include_usage": True})
    assert all(c["usage"] is None for c in plain[:-1])
    whole = plain[-1]["usage"]
    chunks = streamed(served, {"include_usage": True, "continuous_usage_stats": True})
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    assert {u["prompt_tokens"] for u in usages} == {whole["prompt_tokens"]}
    made = [u["completion_tokens"] for u in usages]
    assert made == sorted(made) and made[0] <= 1 and made[-1] == whole["completion_tokens"] == 12
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: usages[-1][k] for k in counts} == {k: whole[k] for k in counts}
    cached = {u["prompt_tokens_details"]["cached_tokens"] for u in usages}
    assert len(cached) == 1  # the role chunk waited for the prompt to run
    alone = streamed(served, {"continuous_usage_stats": True})  # no include_usage: no change
    carrying = [c for c in alone if "usage" in c]  # the finish chunk only (OAI-STREAM-05)
    assert len(carrying) == 1 and carrying[0]["choices"][0]["finish_reason"] == "length"
