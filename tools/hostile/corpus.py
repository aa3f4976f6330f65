"""The corpus as data: targets, route sets and cases read from tests/data/hostile/.

`routes.json` names the targets (a route with a valid base body, or none) and
the route sets; each `<family>.jsonl` holds that family's cases, one JSON
object a line. `requests(family)` is every case of a family on every route it
names, with its body expanded to bytes and its expected outcome resolved for
the route's document (/v1 or /api). tests/data/hostile/README.md is the
format's reference.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "hostile"
ROUTES = "routes.json"
STATUS_CLASSES = frozenset({"4xx", "not5xx", "none"})
CASE_KEYS = frozenset(
    {"id", "family", "routes", "path", "query", "content_type", "body", "send", "expect"}
)
SEND_KEYS = frozenset({"mode", "chunk", "stop_at", "then", "declare"})
EXPECT_KEYS = frozenset({"status", "code", "param"})

Part = str | Mapping[str, Any]  # text, {"repeat": [part(s), n]} or {"b64": "..."}


@dataclass(frozen=True, slots=True)
class Target:
    """A route with a base body: valid, cheap and without lasting effect (None: no body)."""

    name: str
    method: str
    path: str
    body: Any

    @property
    def document(self) -> str:
        """`api` for spec/openapi/api.yaml (served under /api), else `v1`."""
        return "api" if self.path.startswith("/api") else "v1"


@dataclass(frozen=True, slots=True)
class Send:
    """How the body goes on the wire (the default: whole, with its Content-Length).

    `mode` `chunked` sends it in `chunk`-byte chunks; `stop_at` cuts it after
    that many bytes; `then` is `read` (wait for the answer), `end` (a chunked
    body's terminating 0-chunk, early, then read) or `hangup` (close unanswered);
    `declare` is the Content-Length sent instead of the body's own.
    """

    mode: str = "length"
    chunk: int = 65536
    stop_at: int | None = None
    then: str = "read"
    declare: int | None = None

    @property
    def plain(self) -> bool:
        return self == Send()


@dataclass(frozen=True, slots=True)
class Expect:
    """The outcome: `status` exact, or `4xx`, `not5xx` (any answer below 500) or `none`
    (no answer: the client hung up); `code` and `param` are checked when pinned."""

    status: int | str
    code: str | Mapping[str, str] | None = None
    param: str | None = None
    param_pinned: bool = False


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    family: str
    routes: tuple[str, ...]
    content_type: str | None
    body: tuple[Part, ...] | None
    expect: Expect
    path: str | None = None
    query: str = ""
    send: Send = field(default_factory=Send)

    def body_bytes(self) -> bytes | None:
        return None if self.body is None else expand(self.body)


@dataclass(frozen=True, slots=True)
class Request:
    """One case on one target: what goes on the wire and what must come back."""

    case: Case
    target: Target
    body: bytes | None

    @property
    def method(self) -> str:
        return self.target.method

    @property
    def path(self) -> str:
        """The request target as sent: the case's own path, else the route's, and its query."""
        path = self.case.path if self.case.path is not None else self.target.path
        return path + self.case.query

    @property
    def code(self) -> str | None:
        code = self.case.expect.code
        return code.get(self.target.document) if isinstance(code, Mapping) else code

    @property
    def label(self) -> str:
        return f"{self.case.id} [{self.method} {self.path[:80]}]"


# -- bodies --------------------------------------------------------------------------


def expand(parts: Sequence[Part] | Part) -> bytes:
    """The bytes a body template stands for."""
    if isinstance(parts, str):
        return parts.encode("utf-8")
    if isinstance(parts, Mapping):
        if "b64" in parts:
            return base64.b64decode(parts["b64"])
        inner, times = parts["repeat"]
        return expand(inner) * int(times)
    return b"".join(expand(part) for part in parts)


def body_parts(raw: Any) -> tuple[Part, ...] | None:
    """`body` as a case states it: null, one text, or a list of parts."""
    if raw is None:
        return None
    return (raw,) if isinstance(raw, str) else tuple(raw)


# -- reading -------------------------------------------------------------------------


@cache
def _routes(data: Path = DATA) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((data / ROUTES).read_text(encoding="utf-8"))
    return loaded


def targets(data: Path = DATA) -> dict[str, Target]:
    return {
        name: Target(name, t["method"], t["path"], t.get("body"))
        for name, t in _routes(data)["targets"].items()
    }


def route_sets(data: Path = DATA) -> dict[str, list[str]]:
    sets: dict[str, list[str]] = _routes(data)["sets"]
    return sets


def model(data: Path = DATA) -> str:
    """The model id the base bodies name (the embedded default GGUF)."""
    return str(_routes(data)["model"])


def families(data: Path = DATA) -> list[str]:
    return sorted(p.stem for p in data.glob("*.jsonl"))


def case(raw: Mapping[str, Any], sets: Mapping[str, Sequence[str]]) -> Case:
    """One case from its JSON object; unknown keys are refused (a typo is not a default)."""
    _known(raw, CASE_KEYS, "case")
    routes = raw["routes"]
    names = tuple(sets[routes]) if isinstance(routes, str) else tuple(routes)
    expect = raw["expect"]
    _known(expect, EXPECT_KEYS, "expect")
    status = expect["status"]
    if not isinstance(status, int) and status not in STATUS_CLASSES:
        raise ValueError(f"{raw['id']}: status {status!r} is not a status or a class")
    send = raw.get("send", {})
    _known(send, SEND_KEYS, "send")
    return Case(
        id=raw["id"],
        family=raw["family"],
        routes=names,
        content_type=raw["content_type"],
        body=body_parts(raw["body"]),
        expect=Expect(status, expect.get("code"), expect.get("param"), "param" in expect),
        path=raw.get("path"),
        query=raw.get("query", ""),
        send=Send(**send),
    )


def _known(raw: Mapping[str, Any], keys: frozenset[str], what: str) -> None:
    unknown = set(raw) - keys
    if unknown:
        raise ValueError(f"unknown {what} keys {sorted(unknown)} in {raw}")


def cases(family: str, data: Path = DATA) -> list[Case]:
    sets = route_sets(data)
    lines = (data / f"{family}.jsonl").read_text(encoding="utf-8").splitlines()
    return [case(json.loads(line), sets) for line in lines if line.strip()]


def requests(family: str, data: Path = DATA) -> Iterator[Request]:
    """Every case of `family` on every route it names, in file order."""
    known = targets(data)
    for one in cases(family, data):
        body = one.body_bytes()
        for name in one.routes:
            yield Request(one, known[name], body)
