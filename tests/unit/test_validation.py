"""Request-body validation: jsonschema-rs's quick check never lets through a body
Connexion's validator refuses (impl/http/validation.py).

A body is refused exactly when Connexion's Draft 4 request validator refuses it
(OAI-ERR-01, LOC-GEN-14: the refusal and its words are that validator's). The
quick check only spares valid bodies that validator's walk, so what must hold is
one implication: the quick check passes ⇒ the validator passes. It is checked on
each keyword the contract's schemas use, at its edges, and on mutations of real
bodies against every body schema of both documents.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from connexion.spec import Specification
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miserver.http.validation import Compiled, compiled, with_null

EDGE_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 0.5, -0.0, 2**63 - 1, -(2**63), 1e308, "", "a",
    "abc\n", "\n", "é", "😀", "a" * 129, [], [1], [1, 1], [1, 1.0], [1, True], [None],
    {}, {"a": 1}, {"a": None}, {"type": "x"},
]  # fmt: skip

KEYWORD_SCHEMAS: dict[str, dict[str, Any]] = {
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "string": {"type": "string"},
    "array": {"type": "array"},
    "object": {"type": "object"},
    "nullable-integer": {"type": "integer", "nullable": True},
    "nullable-enum": {"type": "string", "enum": ["auto", "none"], "nullable": True},
    "enum-numbers": {"enum": [1, 2.5, "1"]},
    "enum-bool": {"enum": [True]},
    "minimum": {"type": "number", "minimum": 0, "maximum": 2},
    "exclusive": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1,
                  "exclusiveMaximum": True},
    "lengths": {"type": "string", "minLength": 1, "maxLength": 2},
    "pattern-anchored": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
    "pattern-negated": {"type": "string", "minLength": 1, "pattern": "^[^\\x00-\\x1f\\x7f/]+$"},
    "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer"}},
    "unique": {"type": "array", "uniqueItems": True},
    "required": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}},
    "closed": {"type": "object", "additionalProperties": False, "properties": {"a": {}}},
    "open-typed": {"type": "object", "additionalProperties": {"type": "integer"}},
    "one-of": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "all-of": {"allOf": [{"type": "number"}, {"minimum": 1}]},
    "not": {"not": {"type": "string"}},
    "nullable-one-of": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "array"}]},
}  # fmt: skip


def agree(schema: Compiled, body: Any) -> None:
    if schema.passes(body):
        assert schema.full.is_valid(body), f"the quick check let through {body!r}"


@pytest.mark.parametrize("name", sorted(KEYWORD_SCHEMAS))
def test_the_quick_check_passes_nothing_the_validator_refuses_at_each_keyword(name: str) -> None:
    """OAI-ERR-01, LOC-GEN-14: on each keyword the documents use, at its edges
    (1.0 for an integer, `true` for 1, a newline before `$`, `null` where nullable)."""
    schema = Compiled.of(KEYWORD_SCHEMAS[name])
    for value in EDGE_VALUES:
        agree(schema, value)


def test_nullable_means_what_connexion_lets_through() -> None:
    """`nullable` admits `null` to `type` and `enum` and nothing else (connexion's
    allow_nullable): the quick check agrees on both sides, so nulls stay quick."""
    schema = Compiled.of(KEYWORD_SCHEMAS["nullable-enum"])
    assert schema.passes(None) and schema.full.is_valid(None)
    assert not schema.passes("other") and not schema.full.is_valid("other")
    one_of = Compiled.of(KEYWORD_SCHEMAS["nullable-one-of"])
    assert one_of.full.is_valid(None) is one_of.passes(None)
    assert with_null({"type": ["integer"], "nullable": True})["type"] == ["integer", "null"]


# -- every body schema of both documents ------------------------------------------------


def body_schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    """(operation, body schema) as Connexion hands it to the validator: components beside."""
    folder = Path(str(resources.files("miserver.spec") / "openapi"))
    for document in ("v1.yaml", "api.yaml"):
        spec = Specification.load(folder / document)
        for path, item in spec["paths"].items():
            for method, operation in item.items():
                if not isinstance(operation, dict) or "requestBody" not in operation:
                    continue
                content = operation["requestBody"].get("content", {})
                if "application/json" in content:
                    schema = dict(content["application/json"]["schema"])
                    schema["components"] = spec.raw.get("components", {})
                    yield f"{document} {method.upper()} {path}", schema


BODIES = dict(body_schemas())

CHAT = {
    "model": "SmolLM2-135M-Instruct:Q4_1",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": None},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "user", "content": "And?"},
    ],
    "max_tokens": 8,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "stop": None,
    "seed": None,
    "logit_bias": None,
}


def test_the_quick_check_accepts_real_bodies() -> None:
    """A valid chat body, nulls where fields are nullable, passes the quick check: the
    quick path is taken, not the fallback, for what clients send."""
    chat = next(s for name, s in BODIES.items() if name.endswith("/chat/completions"))
    schema = compiled(chat)
    assert schema.full.is_valid(CHAT)
    assert schema.passes(CHAT)
    assert compiled(chat) is schema  # compiled once per operation's schema


def paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(value, dict):
        for key, member in value.items():
            yield from paths(member, (*here, key))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            yield from paths(member, (*here, i))


def mutated(body: dict[str, Any], where: tuple[Any, ...], value: Any) -> Any:
    if not where:
        return value
    out = copy.deepcopy(body)
    holder = out
    for step in where[:-1]:
        holder = holder[step]
    holder[where[-1]] = value
    return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False,
    allow_infinity=False) | st.sampled_from(EDGE_VALUES[:20]) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "name", "model", "x"]), inner,
        max_size=3),
    max_leaves=6,
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_quick_check_passes_no_mutated_body_the_validator_refuses(data: Any) -> None:
    """OAI-ERR-01, LOC-GEN-14: a real chat body with one value replaced anywhere, against
    every body schema of both documents (most refuse it: what matters is the quick check
    never accepts what the validator refuses)."""
    where = data.draw(st.sampled_from(list(paths(CHAT))))
    body = mutated(CHAT, where, data.draw(json_values))
    name = data.draw(st.sampled_from(sorted(BODIES)))
    agree(compiled(BODIES[name]), body)
