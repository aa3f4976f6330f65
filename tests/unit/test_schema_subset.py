"""The JSON Schema subset response_format accepts, checked before any grammar library."""

from __future__ import annotations

from typing import Any

import pytest

from miserver.errors import ApiError
from miserver.serving.chat.schema_subset import PARAM, check, problems

JUDGE: dict[str, Any] = {
    "title": "judge_v1",
    "description": "A verdict.",
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no"], "default": "no"},
        "score": {"type": "number", "minimum": 0, "maximum": 1, "examples": [0.5]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 0, "maxItems": 4},
        "note": {"anyOf": [{"type": "string", "maxLength": 80, "minLength": 1}, {"type": "null"}]},
        "kind": {"const": "v1"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "n": {"type": ["integer", "null"]},
        "ok": {"type": "boolean"},
    },
    "required": ["verdict", "score"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string"}},
}


def test_the_whole_subset_is_accepted() -> None:
    """OAI-SO-20, OAI-SO-21: every supported keyword, the annotations ignored."""
    assert problems(JUDGE) == []
    check(JUDGE)
    assert problems({"type": "object", "additionalProperties": {"type": "integer"}}) == []
    assert problems(True) == [] and problems({}) == []


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"type": "number", "multipleOf": 2}, "/multipleOf"),
        ({"not": {"type": "string"}}, "/not"),
        ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
        ({"allOf": [{"type": "string"}]}, "/allOf"),
        ({"oneOf": [{"type": "string"}]}, "/oneOf"),
        ({"if": {}, "then": {}, "else": {}}, "/if"),
        ({"type": "string", "format": "email"}, "/format"),
        ({"patternProperties": {"^a": {}}}, "/patternProperties"),
        ({"dependentRequired": {"a": ["b"]}}, "/dependentRequired"),
        ({"$schema": "https://json-schema.org/draft/2020-12/schema"}, "/$schema"),
        ({"$ref": "https://example.com/s.json"}, "/$ref"),
        ({"properties": {"a/b": {"type": "string", "format": "uri"}}}, "/properties/a~1b/format"),
        ({"anyOf": [{"type": "string"}, {"not": {}}]}, "/anyOf/1/not"),
        ({"type": "float"}, "/type"),
    ],
    ids=[
        "SO-22-multipleOf",
        "SO-22-not",
        "SO-22-uniqueItems",
        "SO-22-allOf",
        "SO-22-oneOf",
        "SO-22-if",
        "SO-22-format",
        "SO-22-patternProperties",
        "SO-22-dependentRequired",
        "SO-22-schema",
        "SO-22-remote-ref",
        "SO-22-nested-pointer",
        "SO-22-in-anyOf",
        "SO-20-type",
    ],
)
def test_keywords_outside_the_subset_are_named_with_their_pointer(
    schema: dict[str, Any], pointer: str
) -> None:
    """OAI-SO-22: 400 response_format_unsupported naming each keyword and its JSON pointer."""
    with pytest.raises(ApiError) as caught:
        check(schema)
    assert caught.value.code == "response_format_unsupported" and caught.value.param == PARAM
    assert f"{pointer}:" in caught.value.message


def test_every_problem_is_named_at_once() -> None:
    """OAI-SO-22: each unsupported keyword is named, not only the first."""
    found = problems({"type": "object", "not": {}, "properties": {"a": {"format": "x"}}})
    assert found == [
        "/not: keyword `not` is not supported",
        "/properties/a/format: keyword `format` is not supported",
    ]


def test_limits() -> None:
    """OAI-SO-23 (64 KB), OAI-SO-24 (depth 32), OAI-SO-25 (256 properties per object)."""
    big = {"type": "string", "description": "x" * 70_000}
    assert "more than 65536" in problems(big)[0]
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(32):
        deep = {"type": "array", "items": deep}
    assert any("deeper than 32" in p for p in problems(deep))
    assert problems(deep["items"]) == []  # 32 levels are fine
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(257)}}
    assert "257 properties, more than 256" in problems(wide)[0]
    wide["properties"].pop("p0")
    assert problems(wide) == []
