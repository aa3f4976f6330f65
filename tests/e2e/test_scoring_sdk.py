"""Scoring mode through the official `openai` SDK, unchanged, against `miserver serve`.

Legacy completions' `logprobs` and chat's `logprobs`/`top_logprobs` are the
SDK's own parameters; vLLM's `allowed_token_ids` and
`return_tokens_as_token_ids` travel in `extra_body`, as vLLM's users send them.
"""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"
USER: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
ALLOWED = [17, 260, 1000, 5000]


def test_completion_logprobs(sdk: OpenAI) -> None:
    """OAI-SCORE-01, -02, -12, -15, -16, -36: `logprobs=3` parses as OpenAI's legacy shape."""
    raw = sdk.completions.with_raw_response.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=1, logprobs=3
    )
    assert raw.headers["X-miLLM-Steering"] == "none"
    reply = raw.parse()
    (choice,) = reply.choices
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    (top,) = logprobs.top_logprobs
    assert len(top) == 3
    assert logprobs.tokens == [choice.text] == [max(top, key=top.__getitem__)]
    assert logprobs.token_logprobs == [top[choice.text]]
    assert all(v <= 0 for v in top.values())
    assert logprobs.text_offset == [len(PROMPT)]
    assert reply.usage is not None and reply.usage.completion_tokens == 1


def test_allowed_token_ids_through_extra_body(sdk: OpenAI) -> None:
    """OAI-SCORE-01, -03..05, -07: vLLM's fields in `extra_body`; keys are `token_id:<id>`."""
    reply = sdk.completions.create(
        model=MODEL_ID,
        prompt=PROMPT,
        max_tokens=1,
        logprobs=1,
        extra_body={"allowed_token_ids": ALLOWED, "return_tokens_as_token_ids": True},
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    (top,) = logprobs.top_logprobs
    assert sorted(top) == sorted(f"token_id:{i}" for i in ALLOWED)
    assert math.fsum(math.exp(v) for v in top.values()) == pytest.approx(1.0, abs=1e-6)
    assert logprobs.tokens == [max(top, key=top.__getitem__)]


def test_chat_logprobs(sdk: OpenAI) -> None:
    """OAI-CSCORE-02, -13..16, -18: `logprobs=True, top_logprobs=2` parses into the SDK types."""
    reply = sdk.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=1, logprobs=True, top_logprobs=2
    )
    (choice,) = reply.choices
    assert choice.logprobs is not None and choice.logprobs.content is not None
    (entry,) = choice.logprobs.content
    assert entry.token == choice.message.content
    assert entry.bytes == list(entry.token.encode("utf-8"))
    assert len(entry.top_logprobs) == 2
    assert entry.top_logprobs[0].token == entry.token
    assert entry.top_logprobs[0].logprob == entry.logprob
    for alt in entry.top_logprobs:
        assert alt.bytes == list(alt.token.encode("utf-8"))
        assert alt.logprob <= 0


def test_scoring_refusal_is_an_sdk_error(sdk: OpenAI) -> None:
    """OAI-SCORE-09: `allowed_token_ids` (scoring only) with `max_tokens` 100 raises
    BadRequestError, never text. (`logprobs` alone with `max_tokens` 100 generates since
    contract 0.17.0: OAI-SCORE-32 is superseded, docs/DECISIONS.md.)"""
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(
            model=MODEL_ID,
            prompt=PROMPT,
            max_tokens=100,
            logprobs=5,
            extra_body={"allowed_token_ids": [1, 2]},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "invalid_parameter"  # a scoring rule: REQ-000 open point 9
    assert error["param"] == "max_tokens"
