"""How streams end, on both engines over HTTP: usage counted once, one envelope per stream.

With `stream_options.include_usage`, `usage` is an object on exactly one chunk,
the last before `[DONE]` (`choices: []`, with `millm_steering`), and null on
every other; without it, the request's last finish chunk carries the whole
request's usage and no other chunk has the member. Every chunk of a stream has
the same id, created, model and system_fingerprint (REQ-000 STREAM, as issue 15
adopts it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
PROMPTS = ["Once upon a time, in a land far away,", "1, 2, 3, 4, 5,"]
ENVELOPE = ("id", "object", "created", "model", "system_fingerprint")


def streamed(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a stream that ended with `data: [DONE]`."""
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def check_envelope(chunks: list[dict[str, Any]], plain: dict[str, Any], obj: str) -> None:
    """One id, object, created, model and system_fingerprint on every chunk."""
    assert len({tuple(c[k] for k in ENVELOPE) for c in chunks}) == 1, chunks
    first = chunks[0]
    assert first["object"] == obj and first["created"] > 0 and first["model"] == plain["model"]
    assert first["system_fingerprint"] == plain["system_fingerprint"]


def check_usage(chunks: list[dict[str, Any]], include_usage: bool) -> dict[str, Any]:
    """Usage on exactly one chunk, where the rule puts it; returns it."""
    *rest, last = chunks
    assert last["choices"] == [] and last["millm_steering"] == "none"
    with_usage = [c for c in chunks if c.get("usage") is not None]
    assert len(with_usage) == 1, [c.get("usage") for c in chunks]
    if include_usage:
        assert with_usage == [last]
        assert all("usage" in c and c["usage"] is None for c in rest)
    else:
        [finish] = with_usage
        assert finish is [c for c in chunks if c["choices"]][-1]
        assert finish["choices"][0]["finish_reason"] in {"stop", "length"}
        assert [c for c in chunks if "usage" in c] == [finish]
    usage: dict[str, Any] = with_usage[0]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "plain"])
def test_chat_stream_counts_usage_once(served: tuple[TestClient, str], include_usage: bool) -> None:
    """OAI-STREAM-03, OAI-STREAM-05, OAI-STREAM-08, OAI-STREAM-10, OAI-HDR-15: usage once, where
    the rule puts it; the steering chunk is the last and shares the stream's envelope."""
    client, model = served
    body = {"model": model, "messages": STORY, "max_tokens": 5, "temperature": 0}
    plain = client.post(CHAT, json=body).json()
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = streamed(client, CHAT, {**body, **options})
    check_envelope(chunks, plain, "chat.completion.chunk")
    usage = check_usage(chunks, include_usage)
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"] == 5
    assert usage["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("include_usage", [True, False], ids=["include_usage", "plain"])
def test_completion_stream_counts_the_whole_request_once(
    served: tuple[TestClient, str], include_usage: bool
) -> None:
    """OAI-STREAM-05, OAI-STREAM-08, OAI-CMPL-03, REQ-000 open point 20: two prompts stream two
    choices; only one chunk has usage, covering both (never one usage per choice)."""
    client, model = served
    body = {"model": model, "prompt": PROMPTS, "max_tokens": 4, "temperature": 0}
    plain = client.post(CMPL, json=body).json()
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = streamed(client, CMPL, {**body, **options})
    check_envelope(chunks, plain, "text_completion")
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["index"] for c in finishes] == [0, 1]
    usage = check_usage(chunks, include_usage)
    assert usage["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"] == 8


def test_chat_replies_say_refusal_null(served: tuple[TestClient, str]) -> None:
    """OAI-RESP-05: `choices[].message.refusal` is present and null (OpenAI's schema needs it)."""
    client, model = served
    body = {"model": model, "messages": STORY, "max_tokens": 2, "temperature": 0}
    message = client.post(CHAT, json=body).json()["choices"][0]["message"]
    assert "refusal" in message and message["refusal"] is None


@pytest.mark.parametrize(
    "nulls",
    [
        {"foo_bar": None},
        {"user": None, "seed": None, "stop": None, "response_format": None},
        {"messages": [{"role": "user", "content": "Hi", "foo": None, "name": None}]},
        {"stream_options": {"include_usage": None, "foo": None}},
    ],
    ids=["unknown", "known", "nested-unknown", "nested-stream-options"],
)
def test_explicit_nulls_are_no_change_even_in_strict_mode(
    served: tuple[TestClient, str], nulls: dict[str, Any]
) -> None:
    """OAI-VALID-32, OAI-VALID-10: a null field, known or unknown, at any depth, is accepted
    in strict mode and never listed in X-miLLM-Ignored-Fields."""
    client, model = served
    body = {"model": model, "messages": STORY, "max_tokens": 1, "temperature": 0, **nulls}
    stream = "stream_options" in nulls
    for strict in ("true", "false"):
        headers = {"X-miLLM-Strict": strict}
        if stream:
            with client.stream(
                "POST", CHAT, json={**body, "stream": True}, headers=headers
            ) as response:
                response.read()
        else:
            response = client.post(CHAT, json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert "X-miLLM-Ignored-Fields" not in response.headers
