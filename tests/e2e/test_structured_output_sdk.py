"""`response_format` through the official `openai` SDK, unchanged, against `miserver serve`.

The SDK's own ways in: a hand-written `json_schema` format through
`with_raw_response` (to read X-miLLM-Constrained), and `chat.completions.parse`
with a pydantic model, whose strict schema the SDK derives itself.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from jsonschema import Draft202012Validator
from openai import OpenAI
from pydantic import BaseModel, Field

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.e2e

JUDGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "reason": {"type": "string", "maxLength": 24},
    },
    "required": ["verdict", "score", "reason"],
    "additionalProperties": False,
}
QUESTION = "Is the sky blue? Answer yes or no and rate your confidence from 1 to 5."


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=1, le=5)


def test_json_schema_through_raw_response(sdk: OpenAI) -> None:
    """OAI-SO-02, -04, -07, -08: a strict `json_schema` named judge_v1 answers with
    `X-miLLM-Constrained: json_schema;name="judge_v1"` and a document that validates."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Judge this answer: 2 + 2 = 5."}],
        max_tokens=48,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "judge_v1", "schema": JUDGE, "strict": True},
        },
    )
    assert raw.headers["X-miLLM-Constrained"] == 'json_schema;name="judge_v1"'
    (choice,) = raw.parse().choices
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    document = json.loads(choice.message.content)
    assert not list(Draft202012Validator(JUDGE).iter_errors(document))


def test_parse_with_a_pydantic_model(sdk: OpenAI) -> None:
    """OAI-SO-02, -04, -08, -20, -21: `chat.completions.parse(response_format=Verdict)` sends
    the SDK's strict schema (with `title` annotations) and returns a parsed Verdict."""
    completion = sdk.chat.completions.parse(
        model=MODEL_ID,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=32,
        temperature=0,
        response_format=Verdict,
    )
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    parsed = choice.message.parsed
    assert isinstance(parsed, Verdict)
    assert parsed.answer in {"yes", "no"} and 1 <= parsed.confidence <= 5
