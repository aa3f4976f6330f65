"""Families about field values against their schema: wrong types and huge arrays.

types   a value of a type its schema refuses, at every depth of every base body;
        top-level arrays, strings, numbers and `null`
arrays  huge arrays: stop lists, tools, content parts, messages, token ids,
        features, choices
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from . import jsontext, spec
from .edits import Case, base, case, edited, slug, where
from .jsontext import Path, Raw
from .targets import TARGETS, document, json_targets

# -- types ---------------------------------------------------------------------------

SAMPLES: dict[str, Any] = {
    "string": "hostile",
    "integer": 7,
    "object": {},
    "array": [],
    "boolean": True,
    "number": 1.5,
}
NOT_OBJECTS: tuple[tuple[str, str], ...] = (
    ("array", "[]"),
    ("string", '"hostile"'),
    ("number", "7"),
    ("boolean", "true"),
    ("null", "null"),
)


def wrong(types: spec.Types) -> list[tuple[str, Any]]:
    """Up to two values of types `types` refuses."""
    return [(k, v) for k, v in SAMPLES.items() if not types.accepts(k)][:2]


def types() -> Iterator[Case]:
    for label, text in NOT_OBJECTS:
        yield case(
            f"types-top-{label}",
            "types",
            "json",
            text,
            {"status": 400, "code": {"api": "invalid_request"}},
        )
    for name in json_targets():
        method, path, body = TARGETS[name]
        doc = document(path)
        schema = spec.body_schema(doc, method, path)
        assert schema is not None
        for at, value in jsontext.nodes(body):
            if value is None:
                continue  # null: "no change" for every optional field (OAI-VALID-32)
            found = spec.types_at(doc, schema[0], at)
            for kind, sample in wrong(found):
                yield case(
                    f"types-{name}-{slug(at)}-{kind}",
                    "types",
                    [name],
                    edited(name, at, sample),
                    _mistyped(doc, at, found),
                )


def _mistyped(doc: str, at: Path, found: spec.Types) -> dict[str, Any]:
    """400; where no union lies on the way, the code (LOC-GEN-16 on /api; a message role is
    `invalid_request` on /v1, LOC-CHAT-04) and `param` the value's path."""
    if not found.plain:
        return {"status": 400}
    code = "invalid_request" if doc == "api" or at[-1] == "role" else "invalid_parameter"
    return {"status": 400, "code": code, "param": where(at)}


# -- huge arrays ---------------------------------------------------------------------


def many(item: str, count: int) -> list[Any]:
    """A JSON array of `count` copies of `item` (JSON text), as parts."""
    return ["[", {"repeat": [item + ", ", count - 1]}, item + "]"]


_USER = '{"role": "user", "content": "hi"}'
_FEATURE = '{"index": 0, "strength": 1}'
_TOOLS = json.dumps([{"type": "function", "function": {"name": f"t{i}"}} for i in range(2000)])
# (label, target, field, its huge value as JSON text parts, expected status)
ARRAYS: tuple[tuple[str, str, str, list[Any], int | str], ...] = (
    ("stop-20000", "chat", "stop", many('"x"', 20_000), 400),
    ("tools-2000-distinct", "chat", "tools", [_TOOLS], 400),
    ("tools-5000-same-name", "chat", "tools", many(json.dumps(json.loads(_TOOLS)[0]), 5000), 400),
    (
        "content-parts-20000",
        "chat",
        "messages",
        ['[{"role": "user", "content": ', *many('{"type": "text", "text": "hi"}', 20_000), "}]"],
        400,
    ),
    ("messages-5000", "chat", "messages", many(_USER, 5000), 400),
    # scored on either engine since contract 0.17.0: one candidate, named 20,000 times
    ("allowed-token-ids-20000", "chat", "allowed_token_ids", many("1", 20_000), 200),
    (
        "steering-features-20000",
        "chat",
        "steering",
        ['{"features": ', *many(_FEATURE, 20_000), "}"],
        400,
    ),
    ("extra-messages-2000", "chat", "extra_messages", many(f"[{_USER}]", 2000), 400),
    ("stop-20000", "chat-stream", "stop", many('"x"', 20_000), 400),
    ("prompt-ids-20000", "completions", "prompt", many("1", 20_000), 400),
    ("prompt-one-list-20000", "completions-ids", "prompt", ["[", *many("1", 20_000), "]"], 400),
    ("input-strings-20000", "embeddings", "input", many('"a"', 20_000), 400),
    ("input-strings-257", "embeddings", "input", many('"a"', 257), 400),
    ("input-ids-20000", "embeddings-ids", "input", many("1", 20_000), 400),
    ("input-id-lists-300", "embeddings-ids", "input", many("[1]", 300), 400),
    ("features-20000", "features-put", "features", many(_FEATURE, 20_000), 400),
    ("features-20000", "profile-put", "features", many(_FEATURE, 20_000), 400),
    ("choices-20000", "decide", "choices", many('"yes"', 20_000), 400),
    ("reset-20000", "config-put", "reset", many('"hostile-key"', 20_000), "not5xx"),
)


def arrays() -> Iterator[Case]:
    for label, name, field, parts, status in ARRAYS:
        body = {**base(name), field: Raw(tuple(parts))}
        yield case(
            f"arrays-{name}-{label}", "arrays", [name], jsontext.parts(body), {"status": status}
        )


FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {"types": types, "arrays": arrays}
