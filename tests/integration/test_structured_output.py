"""`response_format` on chat completions with the real SmolLM2 (OAI-SO-01..26).

Every generated document is checked, independently of the server, with
`jsonschema`'s Draft 2020-12 validator (tests/structured.py). Generations are kept short: the
schemas bound their strings, numbers and arrays so that a document ends well
inside `max_tokens`, and greedy requests copy a document given in the prompt.
Refusals that need no model run on `bare_client` and check that nothing was
loaded.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import MODEL_ID
from tests.errors import assert_nothing_loaded, error_of
from tests.structured import (
    EVERY_KEYWORD,
    EXAMPLE,
    HEADER,
    JSON_OBJECT,
    SCHEMA_PARAM,
    UNSUPPORTED,
    VERDICT,
    VERDICT_PROMPT,
    ask,
    assert_valid,
    choices,
    every_keyword_reply,
    json_schema,
    streamed,
    streamed_text,
    user,
)

pytestmark = pytest.mark.model


# -- helpers -----------------------------------------------------------------------------


def assert_all_stop_and_validate(response: Any, schema: Any) -> None:
    for finish, text in choices(response):
        assert finish == "stop", text
        assert_valid(text, schema)


def nested(depth: int) -> dict[str, Any]:
    """Arrays of arrays: `depth` schema objects, the root counted."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def with_properties(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def of_size(size: int) -> dict[str, Any]:
    """A one-digit integer schema whose compact JSON is exactly `size` bytes (padded with an
    ignored description)."""
    schema = {"type": "integer", "minimum": 0, "maximum": 9, "description": ""}
    base = len(json.dumps(schema, separators=(",", ":")).encode("utf-8"))
    schema["description"] = "x" * (size - base)
    return schema


# -- constrained generation -------------------------------------------------------------


def test_every_supported_keyword_is_enforced(client: TestClient) -> None:
    """OAI-SO-01, -02, -04, -07, -08, -20, -21: a schema using every keyword of the subset
    (all seven types, `additionalProperties` false and as a schema, local `$ref`, annotations
    that are ignored) gives a complete document that validates, and the header names it."""
    assert_valid(EXAMPLE, EVERY_KEYWORD)
    _, document = every_keyword_reply(client)
    kinds = {type(v) for v in document.values()}
    assert {str, int, float, bool, type(None), list, dict} <= kinds  # all seven JSON types


def test_eight_samples_at_temperature_one_all_validate(client: TestClient) -> None:
    """OAI-SO-02, -08, -18: 8 sampled choices (temperature 1, seeded) all end and validate.

    Every document VERDICT allows is at most about 14 tokens (`answer` an enum, `score` one
    digit, no other key, no free whitespace), so a budget of 24 never cuts one.
    """
    response = ask(
        client, json_schema(VERDICT), VERDICT_PROMPT, n=8, temperature=1, seed=7, max_tokens=24
    )
    found = choices(response)
    assert len(found) == 8
    for finish, text in found:
        assert finish == "stop", found
        assert_valid(text, VERDICT)


def test_strict_false_is_still_enforced(client: TestClient) -> None:
    """OAI-SO-04, -05, -07: `strict: false` constrains exactly as `strict: true` does; a prompt
    that asks for prose still gets a valid document."""
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[a-z]{2}$"},
            **VERDICT["properties"],
        },
        "required": ["code", "answer", "score"],
        "additionalProperties": False,
    }
    response = ask(client, json_schema(schema, "loose", strict=False), "Write a short poem.")
    assert_all_stop_and_validate(response, schema)
    assert response.headers[HEADER] == 'json_schema;name="loose"'


@pytest.mark.parametrize(
    "text",
    ['Reply with the JSON object {"ok": true} and nothing else.', "Write a short poem."],
    ids=["OAI-SO-03-asked", "OAI-SO-03-prose-prompt"],
)
def test_json_object_gives_one_object(client: TestClient, text: str) -> None:
    """OAI-SO-01, -03, -06, -08: `json_object` yields a single JSON object, whatever the
    prompt asks for, and says so in X-miLLM-Constrained."""
    response = ask(client, JSON_OBJECT, text, max_tokens=16)
    ((finish, content),) = choices(response)
    assert response.headers[HEADER] == "json_object"
    assert content.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert finish == "length"


def test_text_format_is_unconstrained(client: TestClient) -> None:
    """OAI-SO-01: `{"type": "text"}` is ordinary generation, with no X-miLLM-Constrained."""
    response = ask(client, {"type": "text"}, "Say hello.", max_tokens=4)
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers


def test_length_returns_the_incomplete_text(client: TestClient) -> None:
    """OAI-SO-09: `max_tokens` cutting the document is 200 with `finish_reason: "length"` and
    the unfinished text, never a validation error."""
    response = ask(client, JSON_OBJECT, 'Reply with the JSON object {"ok": true}.', max_tokens=3)
    ((finish, text),) = choices(response)
    assert finish == "length"
    assert text.startswith("{")
    with pytest.raises(ValueError):
        json.loads(text)


def test_length_even_when_the_text_happens_to_parse(client: TestClient) -> None:
    """OAI-SO-08, -09: `const: 7` with one token writes "7", which parses, but the model did not
    end the document (its end token was not reached), so the finish is "length"; with room
    the same document ends with "stop"."""
    ((finish, text),) = choices(ask(client, json_schema({"const": 7}), max_tokens=1))
    assert (finish, json.loads(text)) == ("length", 7)
    ((finish, text),) = choices(ask(client, json_schema({"const": 7}), max_tokens=4))
    assert (finish, json.loads(text)) == ("stop", 7)


def test_n_and_extra_messages_are_each_constrained(client: TestClient) -> None:
    """OAI-SO-18, -19: with `n` = 2 over two conversations (`extra_messages`), each of the
    four choices has its own grammar state and validates."""
    response = ask(
        client,
        json_schema(VERDICT, "verdict"),
        VERDICT_PROMPT,
        extra_messages=[user("Is grass red? Answer and rate your confidence from 1 to 5.")],
        n=2,
        temperature=1,
        seed=1,
    )
    assert len(choices(response)) == 4
    assert_all_stop_and_validate(response, VERDICT)
    assert response.headers[HEADER] == 'json_schema;name="verdict"'


@pytest.mark.parametrize(
    "schema",
    [nested(32), with_properties(256), of_size(65536)],
    ids=["OAI-SO-24-depth-32", "OAI-SO-25-256-properties", "OAI-SO-23-64KB"],
)
def test_schemas_at_the_limits_are_accepted(client: TestClient, schema: dict[str, Any]) -> None:
    """OAI-SO-23..25: a schema exactly at a limit is served (one token, so "length")."""
    ((finish, _),) = choices(ask(client, json_schema(schema), max_tokens=1))
    assert finish == "length"


def test_a_pattern_the_library_cannot_enforce_is_refused(client: TestClient) -> None:
    """OAI-SO-20, -22: `pattern` is in the subset, but a look-ahead is refused by the grammar
    library when it compiles: 400 response_format_unsupported naming the schema, never a
    generation."""
    response = ask(client, json_schema({"type": "string", "pattern": "^(?=a)a+$"}))
    error = error_of(response, 400, UNSUPPORTED, SCHEMA_PARAM)
    assert "look" in error["message"]


def test_invalid_complete_document_is_a_500(client: TestClient) -> None:
    """OAI-SO-10, OAI-SO-08: a complete document that fails validation is 500
    constrained_output_invalid, never a 200.

    Provoked deterministically: the grammar library reads the pattern `^[[:digit:]]{3}$` with
    POSIX classes, so `[[:digit:]]` is one digit and it generates e.g. "132"; Python's `re`,
    which jsonschema uses to validate, reads `[[:digit:]` as a character set followed by a
    literal `]`, so the finished document fails the server's own last check.
    """
    schema = {"type": "string", "pattern": "^[[:digit:]]{3}$"}
    response = ask(client, json_schema(schema), "Give me a three-digit number.", max_tokens=8)
    error = error_of(response, 500, "constrained_output_invalid", None)
    assert error["type"] == "server_error"


@pytest.mark.parametrize(
    "response_format", [JSON_OBJECT, json_schema(VERDICT)], ids=["json_object", "json_schema"]
)
def test_a_stream_is_constrained_as_the_reply_is(client: TestClient, response_format: Any) -> None:
    """OAI-SO-14 superseded (issue 15: LangChain streams structured output), OAI-SO-01..03,
    OAI-STREAM-05: a streamed constrained reply's deltas join to the non-streamed greedy
    document, which validates, and end with finish_reason stop."""
    plain = choices(ask(client, response_format, VERDICT_PROMPT, max_tokens=64))
    text, reason = streamed_text(streamed(client, response_format, VERDICT_PROMPT, max_tokens=64))
    assert [(reason, text)] == plain
    if response_format["type"] == "json_schema":  # greedy json_object may run to the budget
        assert reason == "stop"
        assert_valid(text, VERDICT)


def test_an_invalid_streamed_document_ends_in_an_error_event(client: TestClient) -> None:
    """OAI-SO-10, OAI-STREAM-06: a streamed document that ends complete but fails the last
    check ends the stream with a constrained_output_invalid error event before [DONE] (the
    status stays 200), never a finish chunk that calls it done."""
    schema = {"type": "string", "pattern": "^[[:digit:]]{3}$"}
    events = streamed(client, json_schema(schema), "Give me a three-digit number.", max_tokens=8)
    assert events[-1]["error"]["code"] == "constrained_output_invalid"
    assert not any(c["choices"][0]["finish_reason"] for c in events if c.get("choices"))


def test_a_refusal_changes_nothing(client: TestClient) -> None:
    """OAI-SO-15, -22: refused requests on a loaded server leave the model and the next
    constrained answer as they were."""
    before = ask(client, json_schema(VERDICT), VERDICT_PROMPT)
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    error_of(ask(client, json_schema(VERDICT), stop="}"), 400, UNSUPPORTED, "response_format")
    bad = {**VERDICT, "uniqueItems": True}
    error_of(ask(client, json_schema(bad)), 400, UNSUPPORTED, SCHEMA_PARAM)
    after = ask(client, json_schema(VERDICT), VERDICT_PROMPT)
    assert choices(after) == choices(before)
    assert client.app.state.manager.resident.engine is engine  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["jüdge", "", "a b", "x" * 65])
def test_a_name_outside_openais_pattern_is_refused(bare_client: TestClient, name: str) -> None:
    """OAI-SO-04, -07: `json_schema.name` is OpenAI's `[a-zA-Z0-9_-]{1,64}` (it goes into
    the X-miLLM-Constrained header): anything else is a 400 naming it, never a 500."""
    response = ask(bare_client, json_schema({"const": 7}, name), max_tokens=4)
    assert response.status_code == 400, response.text
    assert "response_format" in str(response.json()["error"]["param"])
    assert_nothing_loaded(bare_client)


# -- refusals before any load ------------------------------------------------------------


UNSUPPORTED_KEYWORDS: list[tuple[dict[str, Any], list[str]]] = [
    ({"type": "integer", "multipleOf": 2}, ["/multipleOf"]),
    ({"not": {"type": "string"}}, ["/not"]),
    (
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
        ["/properties/tags/uniqueItems"],
    ),
    ({"allOf": [{"type": "integer"}]}, ["/allOf"]),
    ({"$defs": {"x": {"oneOf": [{"type": "integer"}]}}, "$ref": "#/$defs/x"}, ["/$defs/x/oneOf"]),
    ({"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {}}, ["/if", "/then", "/else"]),
    (
        {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}},
        ["/properties/when/format"],
    ),
    ({"type": "object", "patternProperties": {"^a": {}}}, ["/patternProperties"]),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, ["/dependentRequired"]),
    (
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"},
        ["/$schema"],
    ),
    ({"properties": {"a": {"$ref": "https://example.com/a.json"}}}, ["/properties/a/$ref"]),
    ({"definitions": {"a": {}}, "$ref": "#/definitions/a"}, ["/definitions", "/$ref"]),
    (
        {"anyOf": [{"type": "integer"}, {"type": "object", "minProperties": 1}]},
        ["/anyOf/1/minProperties"],
    ),
    ({"type": "array", "items": {"contains": {"const": 1}}}, ["/items/contains"]),
    (
        {"properties": {"a/b~c": {"type": "integer", "multipleOf": 3}}},
        ["/properties/a~1b~0c/multipleOf"],
    ),
    ({"type": "date"}, ["/type"]),
]


@pytest.mark.parametrize(
    ("schema", "pointers"),
    UNSUPPORTED_KEYWORDS,
    ids=[
        "OAI-SO-22-multipleOf",
        "OAI-SO-22-not",
        "OAI-SO-22-uniqueItems",
        "OAI-SO-22-allOf",
        "OAI-SO-22-oneOf-in-defs",
        "OAI-SO-22-if-then-else",
        "OAI-SO-22-format",
        "OAI-SO-22-patternProperties",
        "OAI-SO-22-dependentRequired",
        "OAI-SO-22-$schema",
        "OAI-SO-22-remote-$ref",
        "OAI-SO-22-definitions-$ref",
        "OAI-SO-22-in-anyOf",
        "OAI-SO-22-in-items",
        "OAI-SO-22-pointer-escaping",
        "OAI-SO-20-unknown-type",
    ],
)
def test_keywords_outside_the_subset_are_named(
    bare_client: TestClient, schema: dict[str, Any], pointers: list[str]
) -> None:
    """OAI-SO-20, -22: 400 response_format_unsupported naming every keyword outside the
    subset by its JSON pointer, before any load."""
    response = ask(bare_client, json_schema(schema))
    error = error_of(response, 400, UNSUPPORTED, SCHEMA_PARAM)
    for pointer in pointers:
        assert f"{pointer}:" in error["message"], error["message"]
    assert_nothing_loaded(bare_client)


def test_every_problem_is_named_in_one_refusal(bare_client: TestClient) -> None:
    """OAI-SO-22: several keywords at several depths are all named in the one 400."""
    schema = copy.deepcopy(EVERY_KEYWORD)
    schema["properties"]["age"]["multipleOf"] = 5
    schema["properties"]["tags"]["uniqueItems"] = True
    schema["$defs"]["flag"]["not"] = {"const": False}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    error = error_of(ask(bare_client, json_schema(schema)), 400, UNSUPPORTED, SCHEMA_PARAM)
    for pointer in [
        "/properties/age/multipleOf",
        "/properties/tags/uniqueItems",
        "/$defs/flag/not",
        "/$schema",
    ]:
        assert pointer in error["message"]
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (of_size(65537), "65537 bytes"),
        (nested(33), "deeper than 32"),
        (with_properties(257), "257 properties"),
        ({"type": "object", "properties": {"a": with_properties(257)}}, "/properties/a/properties"),
    ],
    ids=["OAI-SO-23", "OAI-SO-24", "OAI-SO-25", "OAI-SO-25-nested"],
)
def test_limits_are_refused(bare_client: TestClient, schema: dict[str, Any], words: str) -> None:
    """OAI-SO-23..25: over 64 KB, deeper than 32 levels, more than 256 properties in one object:
    400 response_format_unsupported, before any load."""
    error = error_of(ask(bare_client, json_schema(schema)), 400, UNSUPPORTED, SCHEMA_PARAM)
    assert words in error["message"]
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": MODEL_ID, "prompt": "Hi"}),
        ("/v1/embeddings", {"model": MODEL_ID, "input": "Hi"}),
    ],
    ids=["OAI-SO-12-completions", "OAI-SO-13-embeddings"],
)
@pytest.mark.parametrize(
    "response_format", [JSON_OBJECT, json_schema(VERDICT)], ids=["json_object", "json_schema"]
)
def test_endpoints_and_engines_that_cannot_honour_it(
    bare_client: TestClient, path: str, body: dict[str, Any], response_format: dict[str, Any]
) -> None:
    """OAI-SO-12, -13 (REQ-000 open point 10): field_not_honoured naming `response_format`,
    before any load (GGUF honours it since the llama.cpp engine constrains: OAI-SO-11 is
    superseded, see test_gguf_structured.py)."""
    response = bare_client.post(path, json={**body, "response_format": response_format})
    error_of(response, 400, "field_not_honoured", "response_format")
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": "}"}, "response_format"),
        ({"stop": ["\n", "END"]}, "response_format"),
        ({"logprobs": True, "max_tokens": 1}, "response_format"),
        ({"logprobs": True, "top_logprobs": 3, "max_tokens": 1}, "response_format"),
        ({"allowed_token_ids": [1, 2], "max_tokens": 1}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
    ids=[
        "OAI-SO-15-stop",
        "OAI-SO-15-stop-list",
        "OAI-SO-16-logprobs",
        "OAI-SO-16-top_logprobs",
        "OAI-SO-16-allowed_token_ids",
        "OAI-SO-26-OAI-TOOLS-28-tools",
    ],
)
@pytest.mark.parametrize(
    "response_format", [JSON_OBJECT, json_schema(VERDICT)], ids=["json_object", "json_schema"]
)
def test_combinations_are_refused(
    bare_client: TestClient, extra: dict[str, Any], param: str, response_format: dict[str, Any]
) -> None:
    """OAI-SO-15, -16, -26 (REQ-000 open point 10): response_format_unsupported naming
    `response_format` (or `tools`), before any load."""
    error_of(ask(bare_client, response_format, **extra), 400, UNSUPPORTED, param)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, SCHEMA_PARAM),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": None}}, SCHEMA_PARAM),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
        ),
        (json_schema({"type": "string", "minLength": -1}), SCHEMA_PARAM),
        (json_schema({"type": "string", "pattern": "("}), SCHEMA_PARAM),
        ({"type": "yaml"}, "response_format.type"),
    ],
    ids=[
        "OAI-SO-04-no-json_schema",
        "OAI-SO-04-no-schema",
        "OAI-SO-04-null-schema",
        "OAI-SO-04-no-name",
        "OAI-SO-04-metaschema",
        "OAI-SO-04-bad-regex",
        "OAI-SO-04-unknown-type",
    ],
)
def test_malformed_response_formats_are_invalid(
    bare_client: TestClient, response_format: dict[str, Any], param: str
) -> None:
    """OAI-SO-04: a json_schema format without its parts, or a schema that is not valid JSON
    Schema, is 400 invalid_parameter naming the part, before any load."""
    error_of(ask(bare_client, response_format), 400, "invalid_parameter", param)
    assert_nothing_loaded(bare_client)
