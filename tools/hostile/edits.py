"""What every family generator shares: a case line, the expectations, paths in a body.

A case is the dict one JSON line holds (tests/data/hostile/README.md). Paths
are tuples (`("messages", 0, "content")`), named as the server names them
(`messages[0].content`, `body` for the whole document).
"""

from __future__ import annotations

from typing import Any

from . import jsontext, spec
from .jsontext import Path, Raw
from .targets import TARGETS, document

JSON = "application/json"
UNREADABLE = {"v1": "invalid_json", "api": "invalid_request"}  # the text as a whole at fault
BAD_VALUE = "invalid_parameter"  # one value at fault: NaN, a lone surrogate, a number's range
MAX_DEPTH = 64  # JSON_MAX_DEPTH's default: the top container is level 1
Case = dict[str, Any]


def case(
    id: str,
    family: str,
    routes: str | list[str],
    body: Any,
    expect: dict[str, Any],
    *,
    content_type: str | None = JSON,
    **extra: Any,
) -> Case:
    """One corpus line; `body` is parts (a list), one text, or None."""
    if isinstance(body, list) and len(body) == 1 and isinstance(body[0], str):
        body = body[0]
    out = {"id": id, "family": family, "routes": routes, "content_type": content_type}
    return {**out, **extra, "body": body, "expect": expect}


def refused(param: str | None) -> dict[str, Any]:
    """The reader's refusal of the text (syntax, depth, a name twice): 400, its code per
    document, `param` pinned."""
    return {"status": 400, "code": UNREADABLE, "param": param}


def bad_value(param: str) -> dict[str, Any]:
    """The reader's refusal of one value (NaN, a lone surrogate, a number out of range)."""
    return {"status": 400, "code": BAD_VALUE, "param": param}


def location(path: Path) -> str:
    """A path as the server names it: `messages[0].content`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def where(path: Path) -> str:
    """`location`, or `body` for the whole document."""
    return location(path) or "body"


def slug(path: Path) -> str:
    """A path in a case id: `messages.0.content`."""
    return location(path).replace("[", ".").replace("]", "") or "body"


def base(name: str) -> Any:
    return TARGETS[name][2]


def strings(value: Any) -> list[Path]:
    return [p for p, v in jsontext.nodes(value) if isinstance(v, str)]


def numbers(value: Any) -> list[Path]:
    return [
        p
        for p, v in jsontext.nodes(value)
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]


def objects(value: Any) -> list[Path]:
    root: list[Path] = [()] if isinstance(value, dict) else []
    return root + [p for p, v in jsontext.nodes(value) if isinstance(v, dict)]


def members(value: Any) -> list[Path]:
    return [p for p, _ in jsontext.nodes(value) if isinstance(p[-1], str)]


def edited(name: str, path: Path, new: Any) -> list[Any]:
    return jsontext.parts(jsontext.replaced(base(name), path, new))


def body_text(name: str) -> str:
    """A target's base body as the JSON text the cases edit."""
    return "".join(str(p) for p in jsontext.parts(base(name)))


def required(name: str) -> bool:
    """Whether the target's route requires a body (spec)."""
    method, path, _ = TARGETS[name]
    found = spec.body_schema(document(path), method, path)
    return found is not None and found[1]


def nested(depth: int, kind: str) -> Raw:
    """`depth` containers around `1`: arrays, objects, or both in turn."""
    if kind == "arrays":
        return Raw(({"repeat": ["[", depth]}, "1", {"repeat": ["]", depth]}))
    if kind == "objects":
        return Raw(({"repeat": ['{"a": ', depth]}, "1", {"repeat": ["}", depth]}))
    pairs = depth // 2
    return Raw(({"repeat": ['{"a": [', pairs]}, "1", {"repeat": ["]}", pairs]}))
