"""`response_format` requests and the checks on what they give (OAI-SO).

The schemas the structured-output tests share (`EVERY_KEYWORD` and a document
for it, `VERDICT`), the request builders (`json_schema`, `ask`, `streamed`) and
the checks, each generated document validated independently of the server with
`jsonschema`'s Draft 2020-12 validator (`assert_valid`). Used for both engines
(tests/integration/test_structured_output.py, test_gguf_structured.py) and the
llama.cpp engine's own grammar test.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from tests.conftest import MODEL_ID

CHAT = "/v1/chat/completions"
HEADER = "X-miLLM-Constrained"
SCHEMA_PARAM = "response_format.json_schema.schema"
UNSUPPORTED = "response_format_unsupported"
JSON_OBJECT = {"type": "json_object"}

EVERY_KEYWORD: dict[str, Any] = {
    "title": "Every supported keyword",
    "description": "annotations are accepted and ignored",
    "default": {},
    "examples": [{}],
    "$defs": {"flag": {"type": "boolean", "title": "Flag", "default": True}},
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6, "examples": ["Ann"]},
        "code": {"type": "string", "pattern": "^[a-z]{2}$", "description": "two letters"},
        "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 5},
        "ok": {"$ref": "#/$defs/flag"},
        "nothing": {"type": "null"},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 1, "maxItems": 2},
        "kind": {"const": "person"},
        "either": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "required": ["x", "y"],
            "additionalProperties": {"type": "integer"},
        },
    },
    "required": [
        "name",
        "code",
        "age",
        "score",
        "ok",
        "nothing",
        "tags",
        "kind",
        "either",
        "point",
    ],
    "additionalProperties": False,
}
EXAMPLE = (
    '{"age": 30, "code": "ab", "either": 3, "kind": "person", "name": "Ann", "nothing": null, '
    '"ok": true, "point": {"x": 1, "y": 2}, "score": 2.5, "tags": ["red"]}'
)
"""A valid document for EVERY_KEYWORD: a greedy request asked to repeat it ends in time."""

VERDICT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}
VERDICT_PROMPT = "Is the sky blue? Answer yes or no and rate your confidence from 1 to 5."


def json_schema(schema: Any, name: str = "test_schema", **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, **extra}}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def ask(
    client: TestClient,
    response_format: Any,
    text: str = "Hi",
    *,
    model: str = MODEL_ID,
    **extra: Any,
) -> Any:
    """A short greedy chat under `response_format` (`model`: the engine's model)."""
    body = {
        "model": model,
        "messages": user(text),
        "max_tokens": 32,
        "temperature": 0,
        "response_format": response_format,
        **extra,
    }
    return client.post(CHAT, json=body)


def choices(response: Any) -> list[tuple[str, str]]:
    """(finish_reason, content) of every choice of a 200."""
    assert response.status_code == 200, response.text
    return [(c["finish_reason"], c["message"]["content"]) for c in response.json()["choices"]]


def assert_valid(text: str, schema: Any) -> Any:
    document = json.loads(text)
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(document)]
    assert not errors, f"{text!r}: {errors}"
    return document


def every_keyword_reply(client: TestClient, model: str = MODEL_ID) -> tuple[Any, Any]:
    """`model`'s reply to the every-keyword schema (either engine): it stops, its header
    names the schema, and its document validates; the response and that document."""
    response = ask(
        client,
        json_schema(EVERY_KEYWORD, "every_keyword", strict=True),
        f"Repeat this JSON exactly: {EXAMPLE}",
        model=model,
        max_tokens=96,
    )
    ((finish, text),) = choices(response)
    assert finish == "stop", text
    assert response.headers[HEADER] == 'json_schema;name="every_keyword"'
    return response, assert_valid(text, EVERY_KEYWORD)


def streamed(
    client: TestClient, response_format: Any, text: str, model: str = MODEL_ID, **extra: Any
) -> list[Any]:
    """The events of a streamed constrained reply (status 200), [DONE] last."""
    body = {
        "model": model,
        "messages": user(text),
        "max_tokens": 32,
        "temperature": 0,
        "response_format": response_format,
        "stream": True,
        **extra,
    }
    with client.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-millm-constrained"].startswith(response_format["type"])
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def streamed_text(events: list[Any]) -> tuple[str, str | None]:
    """The content deltas joined, and the finish reason."""
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in events if c.get("choices")
    )
    reasons = [c["choices"][0]["finish_reason"] for c in events if c.get("choices")]
    return text, reasons[-1]
