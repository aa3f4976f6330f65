"""The request-body schemas of spec/openapi, read for the generator.

`operation(method, path)` finds a route's operation in its document;
`body_schema` its JSON request body; `types_at(document, schema, path)` the
JSON types a value at `path` inside such a body may take (None: any), and
whether the way there crossed no `oneOf`/`anyOf` (then the validator names the
value's own path in its refusal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from .corpus import ROOT
from .jsontext import Path

SPECS = ROOT / "spec" / "openapi"
PREFIXES = {"v1": "/v1", "api": "/api"}
JSON_TYPES = ("string", "integer", "number", "boolean", "array", "object")


@dataclass(frozen=True, slots=True)
class Types:
    """What a value may be: its JSON types (None: any), and whether no union was crossed."""

    allowed: frozenset[str] | None
    plain: bool

    def accepts(self, kind: str) -> bool:
        if self.allowed is None:
            return True
        return kind in self.allowed or (kind == "integer" and "number" in self.allowed)


@cache
def document(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SPECS / f"{name}.yaml").read_text(encoding="utf-8"))
    return loaded


def operations(name: str) -> list[tuple[str, str]]:
    """Every (METHOD, served path template) of a document, in its order."""
    found = []
    for path, item in document(name)["paths"].items():
        for method in ("get", "post", "put", "delete", "patch"):
            if method in item:
                found.append((method.upper(), PREFIXES[name] + path))
    return found


def _match(name: str, method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The served path template (`/api/profiles/{name}`) and operation of a concrete path."""
    local = path.removeprefix(PREFIXES[name]).split("?")[0]
    for template, item in document(name)["paths"].items():
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", template)
        if re.fullmatch(pattern, local) and method.lower() in item:
            op: dict[str, Any] = item[method.lower()]
            return PREFIXES[name] + template, op
    raise KeyError(f"{method} {path} is not in {name}.yaml")


def operation(name: str, method: str, path: str) -> dict[str, Any]:
    return _match(name, method, path)[1]


def template(name: str, method: str, path: str) -> str:
    return _match(name, method, path)[0]


def body_schema(name: str, method: str, path: str) -> tuple[dict[str, Any], bool] | None:
    """The JSON request body's schema and whether the body is required (None: no body)."""
    body = operation(name, method, path).get("requestBody")
    if body is None:
        return None
    return body["content"]["application/json"]["schema"], bool(body.get("required", False))


def types_at(name: str, schema: Mapping[str, Any], path: Path) -> Types:
    """The JSON types a value at `path` inside a body of `schema` may take."""
    branches, plain = _expanded(name, schema)
    for step in path:
        following: list[Mapping[str, Any]] = []
        for branch in branches:
            inner = _step(branch, step)
            if inner is not None:
                expanded, inner_plain = _expanded(name, inner)
                following += expanded
                plain = plain and inner_plain
        branches = following
    kinds: set[str] = set()
    for branch in branches:
        if "type" not in branch:
            return Types(None, plain)
        kinds.add(branch["type"])
        if branch.get("nullable"):
            kinds.add("null")
    return Types(frozenset(kinds), plain and len(branches) == 1)


def _expanded(name: str, schema: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], bool]:
    """`schema` as its branches ($ref resolved, oneOf/anyOf/allOf unfolded)."""
    schema = _resolved(name, schema)
    for union in ("oneOf", "anyOf", "allOf"):
        if union in schema:
            out: list[Mapping[str, Any]] = []
            for branch in schema[union]:
                out += _expanded(name, branch)[0]
            return out, union == "allOf" and len(out) == 1
    return [schema], True


def _resolved(name: str, schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        node: Any = document(name)
        for key in schema["$ref"].removeprefix("#/").split("/"):
            node = node[key]
        schema = node
    return schema


def _step(schema: Mapping[str, Any], step: str | int) -> Mapping[str, Any] | None:
    """The schema one step down (a member's or an item's), None where the step cannot go."""
    kind = schema.get("type")
    if isinstance(step, int):
        if kind not in (None, "array"):
            return None
        items: Mapping[str, Any] = schema.get("items", {})
        return items
    if kind not in (None, "object"):
        return None
    properties = schema.get("properties", {})
    if step in properties:
        member: Mapping[str, Any] = properties[step]
        return member
    extra = schema.get("additionalProperties", True)
    return extra if isinstance(extra, Mapping) else {}
