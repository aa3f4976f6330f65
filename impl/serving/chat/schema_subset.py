"""The JSON Schema subset `response_format: json_schema` accepts (OAI-SO-20).

`problems(schema)` walks a schema and names, by JSON pointer, every keyword
outside the subset in spec/policy/json_schema_subset.yaml, every `$ref` that
is not local into `$defs`, every `type` outside the seven, and every limit
passed (size, depth, properties per object). `check(schema)` raises one
`400 response_format_unsupported` naming all of them. It runs before any
grammar library sees the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ...errors import ApiError

PARAM = "response_format.json_schema.schema"


@dataclass(frozen=True, slots=True, kw_only=True)
class Subset:
    supported: Mapping[str, Mapping[str, Any]]
    ignored: frozenset[str]
    max_bytes: int
    max_depth: int
    max_properties: int


@cache
def subset() -> Subset:
    text = (resources.files("miserver.spec") / "policy" / "json_schema_subset.yaml").read_text(
        "utf-8"
    )
    raw = yaml.safe_load(text)
    limits = raw["limits"]
    return Subset(
        supported=raw["supported"],
        ignored=frozenset(raw["ignored"]),
        max_bytes=int(limits["max_bytes"]),
        max_depth=int(limits["max_depth"]),
        max_properties=int(limits["max_properties"]),
    )


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _walk(node: Any, pointer: str, depth: int, rules: Subset) -> Iterator[str]:
    if isinstance(node, bool):
        return  # `true` / `false` are schemas too
    if not isinstance(node, Mapping):
        yield f"{pointer or '/'}: a schema must be an object or a boolean"
        return
    if depth > rules.max_depth:
        yield f"{pointer}: nested deeper than {rules.max_depth} levels"
        return
    for key, value in node.items():
        here = f"{pointer}/{_escape(str(key))}"
        if key in rules.ignored:
            continue
        rule = rules.supported.get(key)
        if rule is None:
            yield f"{here}: keyword `{key}` is not supported"
            continue
        yield from _check(key, value, here, depth, rule=rule, rules=rules)


def _check(
    key: str, value: Any, here: str, depth: int, *, rule: Mapping[str, Any], rules: Subset
) -> Iterator[str]:
    if "types" in rule:
        names = value if isinstance(value, list) else [value]
        for name in names:
            if name not in rule["types"]:
                yield f"{here}: type {name!r} is not a JSON Schema type"
    if "local" in rule and not (isinstance(value, str) and value.startswith(rule["local"])):
        yield f"{here}: only local references into $defs (`#/$defs/...`) are supported"
    children = rule.get("children")
    if children == "map" and isinstance(value, Mapping):
        if key == "properties" and len(value) > rules.max_properties:
            yield f"{here}: {len(value)} properties, more than {rules.max_properties}"
        for name, child in value.items():
            yield from _walk(child, f"{here}/{_escape(str(name))}", depth + 1, rules)
    elif children == "list" and isinstance(value, list):
        for i, child in enumerate(value):
            yield from _walk(child, f"{here}/{i}", depth + 1, rules)
    elif children in {"schema", "schema_or_bool"}:
        yield from _walk(value, here, depth + 1, rules)


def within(schema: Any) -> Any:
    """`schema` less every keyword outside the subset, at any depth: a looser schema that the
    grammar can enforce (tool arguments: a client's tool is never refused for a keyword).

    An object that named other members by `patternProperties` admits any other member once
    that keyword is gone (`additionalProperties: true` unless it says otherwise), so
    removing a keyword never forbids what the schema allowed.
    """
    if not isinstance(schema, Mapping):
        return schema
    rules = subset()
    out: dict[str, Any] = {}
    for key, value in schema.items():
        rule = rules.supported.get(key)
        if key in rules.ignored:
            out[key] = value
        elif rule is None or ("local" in rule and not str(value).startswith(rule["local"])):
            continue
        elif rule.get("children") == "map" and isinstance(value, Mapping):
            out[key] = {name: within(child) for name, child in value.items()}
        elif rule.get("children") == "list" and isinstance(value, list):
            out[key] = [within(child) for child in value]
        elif rule.get("children") in {"schema", "schema_or_bool"}:
            out[key] = within(value)
        else:
            out[key] = value
    if "patternProperties" in schema:
        out.setdefault("additionalProperties", True)
    return out


def problems(schema: Any) -> list[str]:
    """Every way `schema` leaves the subset, each with its JSON pointer."""
    rules = subset()
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > rules.max_bytes:
        return [f"the schema is {size} bytes, more than {rules.max_bytes}"]
    return list(_walk(schema, "", 1, rules))


def check(schema: Any) -> None:
    """Raise `400 response_format_unsupported` naming every problem (OAI-SO-22)."""
    found = problems(schema)
    if found:
        raise ApiError(
            "response_format_unsupported",
            "The schema leaves the supported subset: " + "; ".join(found) + ".",
            PARAM,
        )
