"""The official `openai` SDK, unchanged, against `miserver serve` on loopback.

Everything greedy (temperature 0) unless the test is about sampling, and
every generation short, so the whole module stays within seconds of CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk

from tests.conftest import MODEL_ID
from tests.e2e.conftest import LiveServer, checked_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
"""A text prompt SmolLM2 continues greedily for thousands of tokens (it keeps counting)."""
CONTEXT_LENGTH = 8192


def greedy_text(sdk: OpenAI, max_tokens: int = 16) -> str:
    reply = sdk.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=max_tokens, temperature=0
    )
    text = reply.choices[0].message.content
    assert text
    return text


def stop_word(text: str, nth: int) -> tuple[str, str]:
    """The `nth` word of `text` as a stop sequence, and what precedes its first occurrence."""
    words = text.split()
    assert len(words) > nth, f"too short to pick a stop word from: {text!r}"
    word = words[nth]
    return word, text[: text.index(word)]


def stream_chunks(sdk: OpenAI, **body: Any) -> list[ChatCompletionChunk]:
    stream = sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, stream=True, **body)
    return list(stream)


def streamed_text(chunks: list[ChatCompletionChunk]) -> str:
    """The SDK's documented loop: index `choices` only when there are some."""
    text = ""
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


def test_chat_completion(sdk: OpenAI) -> None:
    """OAI-INTEG-04, OAI-RESP-01..05, OAI-RESP-07, OAI-RESP-11: a plain chat through the SDK."""
    reply = sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=8, temperature=0)
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert isinstance(reply.created, int) and reply.created > 0
    assert reply.model == MODEL_ID
    assert [c.index for c in reply.choices] == [0]
    message = reply.choices[0].message
    assert message.role == "assistant"
    assert isinstance(message.content, str) and message.content
    assert reply.choices[0].finish_reason in {"stop", "length"}
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.system_fingerprint is not None
    assert reply.system_fingerprint.startswith(f"millm:{MODEL_ID}@")


def test_chat_stream(sdk: OpenAI) -> None:
    """OAI-INTEG-04, OAI-STREAM-03/04/05/08/10: role, deltas, finish + usage, steering chunk.

    The streamed text equals the non-streamed text of the same greedy request.
    """
    chunks = stream_chunks(sdk, max_tokens=12, temperature=0)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1

    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"

    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finals) == 1
    final = finals[0]
    assert final.choices[0].finish_reason in {"stop", "length"}
    assert final.usage is not None
    assert 0 < final.usage.completion_tokens <= 12
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens

    content = [c for c in chunks[1 : chunks.index(final)] if c.choices]
    assert content and all(c.choices[0].delta.content for c in content)

    extensions = chunks[chunks.index(final) + 1 :]
    assert [c.choices for c in extensions] == [[]]
    assert extensions[-1].model_extra is not None
    assert extensions[-1].model_extra["millm_steering"] == "none"

    assert streamed_text(chunks) == greedy_text(sdk, max_tokens=12)


def test_stream_include_usage_and_framing(sdk: OpenAI) -> None:
    """OAI-STREAM-01/02/05/08/10: `data:` frames, `[DONE]` last, before it one chunk with
    `choices: []`, the usage and the steering value; usage null on every other chunk."""
    with sdk.chat.completions.with_streaming_response.create(
        model=MODEL_ID,
        messages=HELLO,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line[6:]) for line in lines[:-1]]
    *rest, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 4
    assert last.model_extra == {"millm_steering": "none"}
    assert all(chunk.usage is None for chunk in rest)
    assert len({(c.id, c.created, c.model, c.system_fingerprint) for c in chunks}) == 1


def test_n_choices(sdk: OpenAI) -> None:
    """OAI-RESP-06: `n: 2` gives two choices with indices 0 and 1."""
    reply = sdk.chat.completions.create(
        model=MODEL_ID, messages=HELLO, n=2, max_tokens=4, temperature=1.0, seed=11
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.role == "assistant" for c in reply.choices)
    assert reply.usage is not None
    assert 2 <= reply.usage.completion_tokens <= 8


@pytest.mark.parametrize("as_list", [False, True], ids=["string", "list"])
def test_stop(sdk: OpenAI, as_list: bool) -> None:
    """OAI-CHAT-20, OAI-RESP-09: the stop text ends the answer and is left out."""
    word, before = stop_word(greedy_text(sdk), 2)
    stop: str | list[str] = ["@@never-generated@@", word] if as_list else word
    reply = sdk.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=32, temperature=0, stop=stop
    )
    assert reply.choices[0].message.content == before
    assert reply.choices[0].finish_reason == "stop"


def test_stop_in_stream(sdk: OpenAI) -> None:
    """OAI-CHAT-21, OAI-STREAM-07: a streamed stop ends the stream early, text left out."""
    word, before = stop_word(greedy_text(sdk), 3)
    plain = sdk.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=32, temperature=0, stop=[word]
    )
    chunks = stream_chunks(sdk, max_tokens=32, temperature=0, stop=[word])
    assert streamed_text(chunks) == before
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and plain.usage is not None
    assert final.usage.completion_tokens == plain.usage.completion_tokens < 32


def test_seed_reruns_identically(sdk: OpenAI) -> None:
    """OAI-SEED-04/05/08: the same seed and body give byte-identical text; the seed is echoed."""

    def sampled(seed: int) -> tuple[str | None, str]:
        reply = sdk.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=12, temperature=1.0, seed=seed
        )
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    assert sampled(1234) == sampled(1234)

    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=HELLO, max_tokens=2, temperature=1.0, seed=7
    )
    assert raw.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert raw.parse().choices[0].message.role == "assistant"

    unseeded = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=HELLO, max_tokens=2, temperature=0
    )
    assert "X-miLLM-Seed" not in unseeded.headers


def test_max_tokens_reached(sdk: OpenAI) -> None:
    """OAI-RESP-10: a small max_tokens ends with `length` after exactly that many tokens."""
    reply = sdk.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=3,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_text_completions(sdk: OpenAI) -> None:
    """OAI-CMPL-01/02: a string prompt gives one choice; a list gives one choice per entry."""
    one = sdk.completions.create(model=MODEL_ID, prompt=COUNTING, max_tokens=4, temperature=0)
    assert one.id.startswith("cmpl-") and one.object == "text_completion"
    assert [c.index for c in one.choices] == [0]
    assert one.choices[0].text.startswith(" 9")
    assert one.choices[0].finish_reason == "length"

    two = sdk.completions.create(
        model=MODEL_ID, prompt=[COUNTING, "The capital of France is"], max_tokens=3, temperature=0
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert (
        two.choices[0].text
        == sdk.completions.create(model=MODEL_ID, prompt=COUNTING, max_tokens=3, temperature=0)
        .choices[0]
        .text
    )
    assert two.usage is not None and two.usage.completion_tokens == 6


def test_models(sdk: OpenAI) -> None:
    """OAI-MODELS-01/02/07: list and retrieve through the SDK."""
    listed = sdk.models.list()
    ids = [m.id for m in listed.data]
    assert MODEL_ID in ids
    assert all(m.object == "model" and isinstance(m.created, int) for m in listed.data)
    model = sdk.models.retrieve(MODEL_ID)
    assert (model.id, model.object) == (MODEL_ID, "model")
    assert isinstance(model.owned_by, str) and model.owned_by


def test_bad_parameter_raises_bad_request(sdk: OpenAI) -> None:
    """OAI-ERR-01, OAI-CHAT-06: a temperature out of range is `openai.BadRequestError` naming it."""
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, temperature=2.5)
    error = caught.value
    assert error.status_code == 400
    assert isinstance(error.body, dict) and error.body["param"] == "temperature"
    assert (error.code, error.param, error.type) == (
        "invalid_parameter",
        "temperature",
        "invalid_request_error",
    )


def test_unknown_model_raises_not_found(sdk: OpenAI) -> None:
    """OAI-ERR-01/03: an unknown model is `openai.NotFoundError` with code model_not_found."""
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
    assert (caught.value.code, caught.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.NotFoundError) as retrieved:
        sdk.models.retrieve("no-such-model")
    assert retrieved.value.status_code == 404


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_context_length_exceeded(sdk: OpenAI, stream: bool) -> None:
    """OAI-ERR-01/04/05/06: max_tokens past the window is refused, for a stream before it starts."""
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=9000, stream=stream)
    error = caught.value
    assert (error.code, error.param) == ("context_length_exceeded", "max_tokens")
    assert str(CONTEXT_LENGTH) in error.message and "9000" in error.message


def sse_lines(response: httpx.Response) -> Iterator[str]:
    return (line for line in response.iter_lines() if line)


def open_stream(client: httpx.Client, base_url: str, body: dict[str, Any]) -> httpx.Response:
    """Send a streamed request and return once its status and headers are in."""
    request = client.build_request("POST", f"{base_url}/completions", json={**body, "stream": True})
    return client.send(request, stream=True)


LONG_STREAM = {"model": MODEL_ID, "prompt": COUNTING, "max_tokens": 2000, "temperature": 0}
SHORT = {"model": MODEL_ID, "prompt": COUNTING, "max_tokens": 4, "temperature": 0}


def test_disconnect_frees_the_server(base_url: str) -> None:
    """README "Scheduling": a client that disconnects stops its generation at the next token.

    (No OAI ID states it; LOC-CANCEL-01 is the /api analogue.) The abandoned
    stream asked for 2000 tokens, over a minute of CPU here; the engine runs
    on one worker thread, so the next short request finishes within seconds
    only if that generation really stopped.
    """
    with httpx.Client(timeout=30.0) as client:
        response = open_stream(client, base_url, LONG_STREAM)
        assert response.status_code == 200
        lines = sse_lines(response)
        for _ in range(2):
            assert next(lines).startswith("data: {")
        response.close()
    started = time.monotonic()
    reply = httpx.post(f"{base_url}/completions", json=SHORT, timeout=30.0)
    elapsed = time.monotonic() - started
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    assert elapsed < 10.0, f"the server was still busy for {elapsed:.1f} s"


def wait_for_comment(lines: Iterator[str], timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    for line in lines:
        if line == ": waiting for a turn":
            return line
        assert line.startswith(":"), f"got data before the turn came: {line}"
        assert time.monotonic() < deadline
    raise AssertionError("the stream ended while waiting")


def admitted_stream(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> httpx.Response:
    """A short stream, retried while the queue is still full."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = open_stream(client, base_url, SHORT)
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        response.read()
        assert response.status_code == 503, response.text
        time.sleep(0.2)


def test_queue_backpressure(queue_server: LiveServer, openai_check: Check) -> None:
    """OAI-ERR-09, LOC-CHAT-49/50/51 (QUEUE_MAX_WAITING=1, heartbeat 0.5 s).

    A long stream holds the slot; a second stream waits and receives
    `: waiting for a turn`; a third request, JSON or stream, gets `503
    queue_full` with Retry-After (a stream before it starts; on /v1/messages Anthropic's `529
    overloaded_error`, contract 0.22.0). The waiter that
    disconnects gives its place up; once the holder leaves, the next waiter
    gets its turn and finishes with `[DONE]`.
    """
    base_url = queue_server.base_url
    with (
        checked_sdk(base_url, openai_check, timeout=30.0) as sdk,
        httpx.Client(timeout=30.0) as holder,
        httpx.Client(timeout=30.0) as waiter,
    ):
        long_stream = open_stream(holder, base_url, LONG_STREAM)
        assert long_stream.status_code == 200
        holding = sse_lines(long_stream)  # kept referenced: a collected reader closes the stream
        assert next(holding).startswith("data: {")

        waiting = open_stream(waiter, base_url, SHORT)
        assert waiting.status_code == 200
        queued = sse_lines(waiting)
        wait_for_comment(queued)

        with pytest.raises(openai.InternalServerError) as caught:
            sdk.completions.create(model=MODEL_ID, prompt=COUNTING, max_tokens=2)
        assert caught.value.status_code == 503
        assert caught.value.code == "queue_full"
        assert int(caught.value.response.headers["Retry-After"]) >= 0

        refused = httpx.post(f"{base_url}/completions", json={**SHORT, "stream": True})
        assert refused.status_code == 503
        assert refused.headers["content-type"].startswith("application/json")
        assert refused.json()["error"]["code"] == "queue_full"
        assert "Retry-After" in refused.headers

        said = {"model": MODEL_ID, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
        overloaded = httpx.post(f"{base_url}/messages", json=said)  # Anthropic's: issue 45
        assert overloaded.status_code == 529, overloaded.text
        error = overloaded.json()["error"]
        assert (error["type"], error["code"]) == ("overloaded_error", "queue_full")
        assert "Retry-After" in overloaded.headers

        waiting.close()  # gives its place up
        with httpx.Client(timeout=30.0) as next_client:
            admitted = admitted_stream(next_client, base_url)
            assert admitted.status_code == 200, admitted.read()
            lines = sse_lines(admitted)
            wait_for_comment(lines)
            long_stream.close()  # the holder leaves; the waiter's turn comes
            rest = [line for line in lines if not line.startswith(":")]
            assert rest[-1] == "data: [DONE]"
            assert any('"finish_reason": "length"' in line for line in rest)
