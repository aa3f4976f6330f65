"""Read-only views of the request schemas in spec/openapi, `$ref`s resolved."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

REQUESTS = {
    "chat": "ChatCompletionRequest",
    "completions": "CompletionRequest",
    "embeddings": "EmbeddingRequest",
    "responses": "CreateResponseRequest",
    "messages": "CreateMessageRequest",
}


MAX_DECLARED = 4096  # more nodes than the documents hold: a bound, never reached
_DECLARED: dict[int, tuple[Mapping[str, Any], dict[str, Schema] | None]] = {}  # by id(node)


@dataclass(frozen=True, slots=True)
class Schema:
    """One schema node inside an OpenAPI document."""

    node: Mapping[str, Any]
    document: Mapping[str, Any]

    def _resolve(self, node: Mapping[str, Any]) -> Schema:
        while "$ref" in node:
            target: Any = self.document
            for part in str(node["$ref"]).removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return Schema(node, self.document)

    def _branches(self) -> list[Schema]:
        me = self._resolve(self.node)
        alts = me.node.get("oneOf") or me.node.get("anyOf")
        return [me._resolve(b) for b in alts] if alts else [me]

    def properties(self) -> dict[str, Schema] | None:
        """Declared members (None for a free-form object or a non-object schema); worked out
        once per node (every request's body is walked against them, serving/policy.py)."""
        found = _DECLARED.get(id(self.node))
        if found is None or found[0] is not self.node:
            if len(_DECLARED) >= MAX_DECLARED:
                _DECLARED.clear()
            found = _DECLARED[id(self.node)] = (self.node, self._properties())
        return found[1]

    def _properties(self) -> dict[str, Schema] | None:
        for branch in self._branches():
            props = branch.node.get("properties")
            if props is not None:
                return {k: Schema(v, self.document) for k, v in props.items()}
        return None

    def items(self) -> Schema | None:
        for branch in self._branches():
            if "items" in branch.node:
                return Schema(branch.node["items"], self.document)
        return None


@dataclass(frozen=True, slots=True)
class Document:
    raw: Mapping[str, Any]

    def request(self, endpoint: str) -> Schema:
        return self.named(REQUESTS[endpoint])

    def named(self, name: str) -> Schema:
        """The document's schema `name` (`components.schemas`), its `$ref`s resolved."""
        return Schema(self.raw["components"]["schemas"][name], self.raw)


@cache
def v1_schema() -> Document:
    text = (resources.files("miserver.spec") / "openapi" / "v1.yaml").read_text("utf-8")
    return Document(yaml.safe_load(text))
