"""Chat completions on the real SmolLM2, in process."""

from __future__ import annotations

import re
from typing import Any

import http_sfv
from starlette.testclient import TestClient

from tests.conftest import MODEL_ID
from tests.events import data_of

CHAT = "/v1/chat/completions"
FINGERPRINT = re.compile(r"^millm:SmolLM2-135M-Instruct@[0-9a-f]{8}:float32/[^:]+:transformers$")


def ask(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], **extra}


def sse_events(client: TestClient, body: dict[str, Any]) -> tuple[Any, list[str]]:
    """The response and its raw SSE lines (comments and data), blank lines dropped."""
    with client.stream("POST", CHAT, json={**body, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    return response, lines


def test_non_streamed_chat_shape(client: TestClient) -> None:
    """OAI-EP-01, OAI-RESP-01..05, OAI-RESP-07, OAI-RESP-11, OAI-SEED-14, OAI-HDR-01, OAI-HDR-05."""
    response = client.post(
        CHAT, json=ask("What is the capital of France?", temperature=0, max_tokens=24)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == MODEL_ID
    assert FINGERPRINT.match(body["system_fingerprint"]), body["system_fingerprint"]
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert "Paris" in choice["message"]["content"]
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert response.headers["X-miLLM-Model"] == MODEL_ID
    assert response.headers["X-miLLM-Steering"] == "none"
    assert "X-miLLM-Seed" not in response.headers
    assert "X-miLLM-Ignored-Fields" not in response.headers


def test_finish_reasons(client: TestClient) -> None:
    """OAI-RESP-08, OAI-RESP-10: `stop` on EOS, `length` at max_tokens."""
    short = client.post(CHAT, json=ask("Say OK.", temperature=0, max_tokens=200)).json()
    assert short["choices"][0]["finish_reason"] == "stop"
    assert short["usage"]["completion_tokens"] < 200
    cut = client.post(CHAT, json=ask("Write a long story.", temperature=0, max_tokens=5)).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 5


def test_max_completion_tokens_is_max_tokens(client: TestClient) -> None:
    """OAI-CHAT-11, OAI-VALID-22: honoured as max_tokens; equal values together are accepted."""
    body = ask("Write a long story.", temperature=0, max_completion_tokens=4)
    assert client.post(CHAT, json=body).json()["usage"]["completion_tokens"] == 4
    both = client.post(CHAT, json={**body, "max_tokens": 4})
    assert both.status_code == 200 and both.json()["usage"]["completion_tokens"] == 4


def test_stop_sequences_are_excluded_and_end_generation(client: TestClient) -> None:
    """OAI-CHAT-19, OAI-CHAT-20, OAI-RESP-09: string or list; the stop text is not returned."""
    base = ask("Count from 1 to 20, one number per line.", temperature=0, max_tokens=40)
    full = client.post(CHAT, json=base).json()["choices"][0]["message"]["content"]
    assert "5" in full
    for stop in ("5", ["zzz", "5"]):
        reply = client.post(CHAT, json={**base, "stop": stop}).json()
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert choice["message"]["content"] == full[: full.index("5")]
        assert reply["usage"]["completion_tokens"] < 40


def test_stream_framing(client: TestClient) -> None:
    """OAI-STREAM-01..05, OAI-STREAM-08, OAI-STREAM-10, OAI-HDR-12..15, OAI-VALID-05."""
    response, lines = sse_events(client, ask("Hello!", temperature=0, max_tokens=12, user="u"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "X-miLLM-Steering" not in response.headers
    assert response.headers["X-miLLM-Ignored-Fields"] == '"user"'
    assert all(line.startswith("data: ") for line in lines)
    events = data_of(lines)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    steering = chunks[-1]
    assert steering == {
        "id": chunks[0]["id"],
        "object": "chat.completion.chunk",
        "created": chunks[0]["created"],
        "model": MODEL_ID,
        "system_fingerprint": chunks[0]["system_fingerprint"],
        "choices": [],
        "millm_steering": "none",
    }
    final = chunks[-2]
    assert final["choices"][0]["finish_reason"] in {"stop", "length"}
    assert final["usage"]["total_tokens"] == (
        final["usage"]["prompt_tokens"] + final["usage"]["completion_tokens"]
    )
    assert [c for c in chunks if "usage" in c] == [final]  # usage once, without include_usage
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    plain = client.post(CHAT, json=ask("Hello!", temperature=0, max_tokens=12)).json()
    assert text == plain["choices"][0]["message"]["content"]


def test_stream_include_usage_moves_usage_to_the_last_chunk(client: TestClient) -> None:
    """OAI-STREAM-05, OAI-STREAM-08: with include_usage, usage is on the last chunk only (the
    `choices: []` steering chunk), null on every other."""
    _, lines = sse_events(
        client, ask("Hi", temperature=0, max_tokens=4, stream_options={"include_usage": True})
    )
    *rest, last = data_of(lines)[:-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert last["millm_steering"] == "none"
    assert all(c["usage"] is None for c in rest)


def test_stop_in_stream_is_enforced_with_hold_back(client: TestClient) -> None:
    """OAI-CHAT-21, OAI-STREAM-07: no stop text leaks; generation ends at the match."""
    body = ask("Count from 1 to 20, one number per line.", temperature=0, max_tokens=40)
    full = client.post(CHAT, json=body).json()["choices"][0]["message"]["content"]
    stop = full[full.index("4") : full.index("4") + 3]  # spans a token boundary: "4\n5"
    _, lines = sse_events(client, {**body, "stop": [stop]})
    chunks = data_of(lines)[:-1]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == full[: full.index(stop)]
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] < 30


def test_n_choices(client: TestClient) -> None:
    """OAI-CHAT-09, OAI-RESP-06: n choices with indices 0..n-1, usage summed."""
    body = client.post(CHAT, json=ask("Name a colour.", n=3, max_tokens=6, seed=3)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] <= 18


def test_seed_reruns_are_byte_identical(client: TestClient) -> None:
    """OAI-CHAT-13, OAI-SEED-03..05: same seed, body and model give the same text; echoed."""
    body = ask("Tell me a short story.", temperature=1.0, max_tokens=24, seed=1234)
    first, second = client.post(CHAT, json=body), client.post(CHAT, json=body)
    assert first.json()["choices"] == second.json()["choices"]
    item = http_sfv.Item()
    item.parse(first.headers["X-miLLM-Seed"].encode())
    assert item.value == 1234 and item.params["scope"] == "request"
    other = client.post(CHAT, json={**body, "seed": 99}).json()
    assert other["choices"] != first.json()["choices"]


def test_seed_on_greedy_is_echoed_and_changes_nothing(client: TestClient) -> None:
    """OAI-SEED-09."""
    plain = client.post(CHAT, json=ask("Hi", temperature=0, max_tokens=8))
    seeded = client.post(CHAT, json=ask("Hi", temperature=0, max_tokens=8, seed=5))
    assert seeded.headers["X-miLLM-Seed"] == '5;scope="request"'
    assert seeded.json()["choices"] == plain.json()["choices"]


def test_context_length_exceeded_before_generation_and_before_a_stream(client: TestClient) -> None:
    """OAI-CHAT-18, OAI-ERR-04, OAI-ERR-05, OAI-ERR-06: 400 with the limit and the ask."""
    body = ask("Hi", max_tokens=9000)
    for response in (
        client.post(CHAT, json=body),
        client.post(CHAT, json={**body, "stream": True}),
    ):
        assert response.status_code == 400
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
        assert "8192" in error["message"] and "9000" in error["message"]


def test_ignored_fields_never_change_the_body(client: TestClient) -> None:
    """OAI-VALID-02, OAI-VALID-06, OAI-VALID-07: reported by location, body unchanged."""
    plain = client.post(CHAT, json=ask("Hi", temperature=0, max_tokens=8))
    extra = ask("Hi", temperature=0, max_tokens=8, user="u", foo=1)
    extra["messages"][0]["name"] = "alice"
    noisy = client.post(CHAT, json=extra)
    assert noisy.status_code == 200
    values = http_sfv.List()
    values.parse(noisy.headers["X-miLLM-Ignored-Fields"].encode())
    assert [v.value for v in values] == ["user", "messages[0].name", "foo"]
    assert noisy.json()["choices"] == plain.json()["choices"]


def test_messages_the_template_cannot_render_are_a_400(client: TestClient) -> None:
    """OAI-ERR-01, OAI-CONT-01: a lone assistant partial has nothing to continue from: 400."""
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "assistant", "content": "Hi"}],
        "max_tokens": 4,
    }
    for response in (
        client.post(CHAT, json=body),
        client.post(CHAT, json={**body, "stream": True}),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "messages"


def test_a_trailing_assistant_message_is_continued(client: TestClient) -> None:
    """OAI-CONT-01..04: the partial answer is continued, and only the new text is returned."""
    partial = "The capital of France is"
    body = {
        "model": MODEL_ID,
        "temperature": 0,
        "max_tokens": 6,
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": partial},
        ],
    }
    reply = client.post(CHAT, json=body).json()
    text = reply["choices"][0]["message"]["content"]
    assert "Paris" in text and not text.startswith(partial)


def test_content_parts_are_accepted(client: TestClient) -> None:
    """OAI-CHAT-04: message content as OpenAI text parts."""
    parts = {
        "model": MODEL_ID,
        "temperature": 0,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
    }
    flat = {
        **parts,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    }
    assert (
        client.post(CHAT, json=parts).json()["choices"]
        == client.post(CHAT, json=flat).json()["choices"]
    )
