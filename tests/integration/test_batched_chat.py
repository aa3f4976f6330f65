"""`extra_messages`: more conversations in one chat request, generated or scored one at a time."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import MODEL_ID
from tests.errors import error_of

pytestmark = pytest.mark.model


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


ROWS = [user("Say hi."), user("Say bye."), user("Count to three.")]


def chat(client: TestClient, messages: Any, **extra: Any) -> Any:
    body = {"model": MODEL_ID, "messages": messages, "temperature": 0, **extra}
    return client.post("/v1/chat/completions", json=body)


def test_each_row_is_one_choice_in_input_order(client: TestClient) -> None:
    """REQ-000 open point 3, OAI-HDR-06, OAI-TOKIDS-01, OAI-SEED-06: every row generates as
    it would alone, one choice each after `messages`; the header is there; the seed's scope
    is batch-shape."""
    alone = [
        chat(client, row, max_tokens=6).json()["choices"][0]["message"]["content"] for row in ROWS
    ]
    response = chat(client, ROWS[0], extra_messages=ROWS[1:], max_tokens=6, seed=5)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == alone
    assert response.headers["X-miLLM-Steering"] == "none"
    assert response.headers["X-miLLM-Seed"] == '5;scope="batch-shape"'
    single = sum(chat(client, r, max_tokens=6).json()["usage"]["prompt_tokens"] for r in ROWS)
    assert body["usage"]["prompt_tokens"] == single


def test_each_row_is_scored_on_its_own(client: TestClient) -> None:
    """OAI-CSCORE-20: with extra_messages, each conversation is scored one at a time and
    returns its own choice, in input order."""
    scoring = {"max_tokens": 1, "logprobs": True, "top_logprobs": 3}
    alone = [chat(client, row, **scoring).json()["choices"][0]["logprobs"] for row in ROWS]
    body = chat(client, ROWS[0], extra_messages=ROWS[1:], **scoring).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for choice, expected in zip(body["choices"], alone, strict=True):
        got = choice["logprobs"]["content"][0]
        assert got["token"] == expected["content"][0]["token"]
        assert got["logprob"] == pytest.approx(expected["content"][0]["logprob"], abs=1e-6)


def test_a_failing_row_fails_the_request_naming_it(client: TestClient) -> None:
    """OAI-CSCORE-21, LOC-CHAT-04: the error names the conversation's index (an unknown role
    is invalid_request, as on `messages`)."""
    bad = [{"role": "user", "content": "x"}, {"role": "banana", "content": "y"}]
    scoring = {"max_tokens": 1, "logprobs": True}
    response = chat(client, ROWS[0], extra_messages=[ROWS[1], bad], **scoring)
    error_of(response, 400, "invalid_request", "extra_messages[1][1].role")
    error_of(
        chat(client, ROWS[0], extra_messages=[[]]), 400, "invalid_parameter", "extra_messages[0]"
    )


def test_unused_fields_of_a_row_are_reported_by_location(client: TestClient) -> None:
    """OAI-VALID-03: `extra_messages[0][0].name`-style locations."""
    row = [{"role": "user", "content": "Hi", "name": "bob"}]
    response = chat(client, ROWS[0], extra_messages=[row], max_tokens=2)
    assert response.headers["X-miLLM-Ignored-Fields"] == '"extra_messages[0][0].name"'


def test_streaming_batched_chat_is_refused(bare_client: TestClient) -> None:
    """REQ-000 open point 3: extra_messages is refused with stream: true."""
    response = chat(bare_client, ROWS[0], extra_messages=ROWS[1:], stream=True)
    error_of(response, 400, "invalid_parameter", "extra_messages")
