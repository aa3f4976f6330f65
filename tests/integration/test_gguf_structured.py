"""The default engine (SmolLM2's GGUF on llama.cpp) over HTTP: `response_format`, `n` and
`seed`, held to what transformers is held to (tests/integration/test_structured_output.py).

Every document is validated here with jsonschema, independently of the server. The same
schemas, prompts and refusals as on transformers are reused; what differs is the engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, JSON, LocalClient, cache_dir
from tests.errors import assert_nothing_loaded, error_of
from tests.structured import (
    HEADER,
    JSON_OBJECT,
    SCHEMA_PARAM,
    UNSUPPORTED,
    VERDICT,
    VERDICT_PROMPT,
    assert_valid,
    choices,
    every_keyword_reply,
    json_schema,
    streamed,
    streamed_text,
    user,
)
from tests.structured import ask as ask_on

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
STORY = "Tell me a short story about a dragon."


def gguf_server(data: Path) -> LocalClient:
    """A server whose launch model is the embedded GGUF (the default), loaded at start."""
    return LocalClient(
        Server(Settings(data_dir=data, cache_dir=cache_dir(), threads=ENGINE_THREADS)),
        raise_server_exceptions=False,
    )


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with gguf_server(tmp_path_factory.mktemp("gguf-structured")) as client:
        yield client


ask = partial(ask_on, model=GGUF_ID)  # the structured-output tests' request, on llama.cpp


def chat(client: TestClient, text: str = STORY, **extra: Any) -> Any:
    body = {"model": GGUF_ID, "messages": user(text), "max_tokens": 16, **extra}
    response = client.post(CHAT, json=body, headers=JSON)
    assert response.status_code == 200, response.text
    return response


def texts(response: Any) -> list[str]:
    return [c["message"]["content"] for c in response.json()["choices"]]


# -- structured output ------------------------------------------------------------------


def test_every_supported_keyword_is_enforced(client: TestClient) -> None:
    """OAI-SO-01, -02, -04, -07, -08, -20, -21, OAI-GGUF-01: every keyword of the subset is
    enforced on llama.cpp; the document validates and the header names it."""
    response, _ = every_keyword_reply(client, GGUF_ID)
    assert response.headers["X-miLLM-Model"] == GGUF_ID


def test_eight_samples_at_temperature_one_all_validate(client: TestClient) -> None:
    """OAI-SO-02, -08, -18, OAI-VALID-21: 8 sampled choices (`n` = 8, temperature 1, seeded)
    each have their own grammar state, end and validate."""
    response = ask(
        client, json_schema(VERDICT), VERDICT_PROMPT, n=8, temperature=1, seed=7, max_tokens=24
    )
    found = choices(response)
    assert len(found) == 8
    for finish, text in found:
        assert finish == "stop", found
        assert_valid(text, VERDICT)
    assert [c["index"] for c in response.json()["choices"]] == list(range(8))


@pytest.mark.parametrize(
    "text",
    ['Reply with the JSON object {"ok": true} and nothing else.', "Write a short poem."],
    ids=["OAI-SO-03-asked", "OAI-SO-03-prose-prompt"],
)
def test_json_object_gives_one_object(client: TestClient, text: str) -> None:
    """OAI-SO-01, -03, -06, -08: `json_object` is one JSON object whatever the prompt asks."""
    response = ask(client, JSON_OBJECT, text, max_tokens=16)
    ((finish, content),) = choices(response)
    assert response.headers[HEADER] == "json_object"
    assert content.startswith("{")
    if finish == "stop":
        assert isinstance(assert_valid(content, {"type": "object"}), dict)
    else:
        assert finish == "length"


def test_length_and_stop(client: TestClient) -> None:
    """OAI-SO-08, -09: a cut document is 200 `length` with the unfinished text; `const: 7`
    with one token parses but did not end ("length"), with room it ends ("stop")."""
    asked = "Reply with a JSON object with the keys name, age and city."
    ((finish, text),) = choices(ask(client, JSON_OBJECT, asked, max_tokens=3))
    assert finish == "length" and text.startswith("{")
    ((finish, text),) = choices(ask(client, json_schema({"const": 7}), max_tokens=1))
    assert (finish, text) == ("length", "7")
    ((finish, text),) = choices(ask(client, json_schema({"const": 7}), max_tokens=4))
    assert (finish, text) == ("stop", "7")


def test_a_pattern_the_library_cannot_enforce_is_refused(client: TestClient) -> None:
    """OAI-SO-20, -22: a look-ahead is refused when the GGUF's grammar compiles: 400
    response_format_unsupported naming the schema, and the next request is served."""
    before = ask(client, json_schema(VERDICT), VERDICT_PROMPT)
    response = ask(client, json_schema({"type": "string", "pattern": "^(?=a)a+$"}))
    assert "look" in error_of(response, 400, UNSUPPORTED, SCHEMA_PARAM)["message"]
    assert choices(ask(client, json_schema(VERDICT), VERDICT_PROMPT)) == choices(before)


def test_invalid_complete_document_is_a_500(client: TestClient) -> None:
    """OAI-SO-10: a complete document that fails the server's validation is 500
    constrained_output_invalid (POSIX `[[:digit:]]` reads differently to llguidance and to
    Python's `re`), on llama.cpp as on transformers."""
    schema = {"type": "string", "pattern": "^[[:digit:]]{3}$"}
    response = ask(client, json_schema(schema), "Give me a three-digit number.", max_tokens=8)
    assert error_of(response, 500, "constrained_output_invalid", None)["type"] == "server_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": "}"}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
    ids=["OAI-SO-15-stop", "OAI-SO-26-tools"],
)
@pytest.mark.parametrize(
    "response_format", [JSON_OBJECT, json_schema(VERDICT)], ids=["json_object", "json_schema"]
)
def test_combinations_are_refused_before_any_load(
    bare_client: TestClient, extra: dict[str, Any], param: str, response_format: Any
) -> None:
    """OAI-SO-15, -26: on GGUF as on transformers, response_format_unsupported before any
    load."""
    error_of(ask(bare_client, response_format, **extra), 400, UNSUPPORTED, param)
    assert_nothing_loaded(bare_client)


def test_keywords_and_limits_are_refused_before_any_load(bare_client: TestClient) -> None:
    """OAI-SO-22, -24: the subset and the limits hold on GGUF, named by pointer, no load."""
    schema = {"type": "integer", "multipleOf": 2}
    error = error_of(ask(bare_client, json_schema(schema)), 400, UNSUPPORTED, SCHEMA_PARAM)
    assert "/multipleOf:" in error["message"]
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(32):
        deep = {"type": "array", "items": deep}
    error = error_of(ask(bare_client, json_schema(deep)), 400, UNSUPPORTED, SCHEMA_PARAM)
    assert "deeper than 32" in error["message"]
    assert_nothing_loaded(bare_client)


def test_scoring_and_batching_stay_refused_on_gguf(bare_client: TestClient) -> None:
    """OAI-SCORE-30 (open point 10), OAI-VALID-17 (open point 3): a GGUF scoring request
    (served since contract 0.17.0) with a response_format is refused as on transformers, and
    `extra_messages` with field_not_honoured, before any load."""
    scoring = ask(bare_client, JSON_OBJECT, logprobs=True, max_tokens=1)
    error_of(scoring, 400, "response_format_unsupported", "response_format")
    batched = ask(bare_client, JSON_OBJECT, extra_messages=[user("Hi")])
    error_of(batched, 400, "field_not_honoured", "extra_messages")
    assert_nothing_loaded(bare_client)


# -- n and seed -------------------------------------------------------------------------


def test_n_three_gives_three_choices(client: TestClient) -> None:
    """OAI-VALID-21, OAI-GGUF-01: `n` = 3 on GGUF: three choices in order, each generated in
    turn; the prompt is counted once."""
    one = chat(client, temperature=1).json()
    three = chat(client, temperature=1, n=3).json()
    assert [c["index"] for c in three["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] in ("stop", "length") for c in three["choices"])
    assert three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert 3 <= three["usage"]["completion_tokens"] <= 3 * 16


def test_a_seed_gives_byte_identical_text_cold_or_warm(tmp_path: Path) -> None:
    """OAI-SEED-04, -05, -03, OAI-GGUF-01 (OAI-SEED-13 superseded): on a fresh server (cold)
    and again once the cache holds the prompt (warm), the same seed and body give
    byte-identical text and finish reasons, `n` choices included; a seeded request reuses
    no cached prompt; the seed is echoed. The choices of one request differ."""
    body = {"temperature": 1, "max_tokens": 24, "n": 3, "seed": 42}
    with gguf_server(tmp_path / "data") as cold_client:
        cold = chat(cold_client, **body)
        chat(cold_client, temperature=0)  # unseeded: the cache keeps this very prompt
        warm = chat(cold_client, **body)
        again = chat(cold_client, **body)
    for response in (cold, warm, again):
        assert response.headers["X-miLLM-Seed"] == '42;scope="request"'
        assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert [c["finish_reason"] for c in warm.json()["choices"]] == [
        c["finish_reason"] for c in cold.json()["choices"]
    ]
    assert texts(cold) == texts(warm) == texts(again)
    assert len(set(texts(cold))) == 3


def test_another_seed_and_no_seed(client: TestClient) -> None:
    """OAI-SEED-05, -08: another seed gives other text; no seed, no X-miLLM-Seed."""
    seven = chat(client, temperature=1, max_tokens=24, seed=7)
    eight = chat(client, temperature=1, max_tokens=24, seed=8)
    assert texts(seven) != texts(eight)
    assert "X-miLLM-Seed" not in chat(client, temperature=1).headers


def test_a_seeded_stream_equals_the_reply(client: TestClient) -> None:
    """OAI-SEED-05, OAI-STREAM-05: a seeded stream's text is the seeded reply's."""
    body = {"temperature": 1, "max_tokens": 24, "seed": 5}
    reply = texts(chat(client, **body))[0]
    payload = {"model": GGUF_ID, "messages": user(STORY), "stream": True, **body}
    with client.stream("POST", CHAT, json=payload, headers=JSON) as response:
        assert response.headers["X-miLLM-Seed"] == '5;scope="request"'
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    pieces = [json.loads(line[6:]) for line in lines]
    streamed = "".join(
        c["delta"].get("content") or "" for p in pieces for c in p.get("choices", [])
    )
    assert streamed == reply


def test_text_completions_take_a_seed(client: TestClient) -> None:
    """OAI-SEED-05, OAI-SEED-12, OAI-VALID-20: `/v1/completions` on GGUF is seeded too, each
    prompt separately (the same prompt twice in one request gives the same text twice)."""
    body = {
        "model": GGUF_ID,
        "prompt": ["Once upon a time", "Once upon a time"],
        "max_tokens": 16,
        "temperature": 1,
        "seed": 11,
    }
    first = client.post("/v1/completions", json=body, headers=JSON)
    second = client.post("/v1/completions", json=body, headers=JSON)
    assert first.status_code == 200, first.text
    assert first.headers["X-miLLM-Seed"] == '11;scope="request"'
    a = [c["text"] for c in first.json()["choices"]]
    assert a == [c["text"] for c in second.json()["choices"]]
    assert a[0] == a[1]


@pytest.mark.parametrize(
    "response_format", [JSON_OBJECT, json_schema(VERDICT)], ids=["json_object", "json_schema"]
)
def test_a_stream_is_constrained_as_the_reply_is(client: TestClient, response_format: Any) -> None:
    """OAI-SO-14 superseded (issue 15), OAI-SO-01..03: on llama.cpp a streamed constrained
    reply joins to the same greedy document as the non-streamed one, and it validates."""
    plain = ask(client, response_format, VERDICT_PROMPT, max_tokens=64)
    assert plain.status_code == 200, plain.text
    events = streamed(client, response_format, VERDICT_PROMPT, GGUF_ID, max_tokens=64)
    text, reason = streamed_text(events)
    assert (reason, text) == (
        plain.json()["choices"][0]["finish_reason"],
        plain.json()["choices"][0]["message"]["content"],
    )
    if response_format["type"] == "json_schema":  # greedy json_object may run to the budget
        assert reason == "stop"
        assert_valid(text, VERDICT)
