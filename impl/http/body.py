"""The request body as JSON: one strict reader for every route, run once at the entry.

`read(raw, max_depth)` turns the body's bytes into the document the
validators and handlers use, or raises `BodyRefused`. It reads JSON (RFC
8259) the way I-JSON (RFC 7493) asks, so that no two parsers (a proxy's and
ours) can see different requests in one body, and no value reaches the
engines that they cannot take:

    refused                                            param              value
    bytes that are not UTF-8, text that is not JSON    none               no
    containers nested deeper than `max_depth`          body               no
    one name twice in an object                        the member's path  no
    NaN, Infinity or -Infinity (not JSON)              the value's path   yes
    a lone surrogate escape (`\\ud800`) in a string    the string's path  yes
      (in a member name: the object's path)
    an integer outside the signed 64-bit range,        the value's path   yes
      a number past a 64-bit float's range (1e400)

`value` says whether one value is at fault (the caller answers
`invalid_parameter` then, as for any value a schema refuses) or the text as
a whole (`invalid_json` on /v1, `invalid_request` on /api).
Paths read like `messages[0].content` (`body` for the whole document). The
security middleware (http/security.py) runs the reader on every /api and /v1
body and keeps the document in the ASGI scope (`BODY_KEY`); Connexion's body
validators (http/validation.py) and the handlers take it from there, so a
body is parsed exactly once.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, MutableMapping
from typing import Any

import numpy as np

BODY_KEY = "miserver.body"  # the ASGI scope key of the parsed document
MAX_DEPTH = 64  # the default nesting limit (the JSON_MAX_DEPTH setting)
INT64 = (-(2**63), 2**63 - 1)
MAX_SHOWN = 40  # characters of an offending number shown in a message

# Scans of the raw text, at C speed. A body none of the last three match needs no walk.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a string literal (its brackets are text)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # an opener 2, a closer 0 (1 less)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # without one, no lone surrogate
# Digits as 0, exponent signs as +: a text without a long run of 0 has no number out of range.
_NUMBER_SHAPE = bytes.maketrans(b"123456789Ee-", b"000000000ee+")
_LONG_NUMBERS = (b"0" * 19, b"e000", b"e+000")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONG_DIGITS = 19  # an integer literal this long may lie outside the signed 64-bit range


class BodyRefused(Exception):
    """The body is not strict JSON; `param` names where (None: the text as a whole), and
    `value` whether one value is at fault rather than the text's structure."""

    def __init__(self, message: str, param: str | None, *, value: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.value = value


class _Repeated(dict[str, Any]):
    """An object that named `name` twice (the walk, which knows its path, reports it)."""

    __slots__ = ("name",)

    def __init__(self, pairs: list[tuple[str, Any]], name: str) -> None:
        super().__init__(pairs)
        self.name = name


class _Unreadable:
    """A value JSON forbids or Python cannot hold (NaN, a 5,000-digit integer) where it stood."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _constant(text: str) -> _Unreadable:
    return _Unreadable(f"is {text}: NaN, Infinity and -Infinity are not JSON")


def _long_integer(text: str) -> int | _Unreadable:
    """parse_int of the second decode, when Python refused an integer's many digits."""
    if len(text.lstrip("-")) < _LONG_DIGITS:
        return int(text)
    return _Unreadable(
        f"is an integer of {len(text.lstrip('-'))} digits: it must lie within the signed "
        "64-bit range"
    )


class _Decode:
    """One decode: the document, and whether it holds a marker the walk must find."""

    def __init__(self, text: str, *, long_integers: bool = False) -> None:
        self.marked = False
        decoder = json.JSONDecoder(
            object_pairs_hook=self._object,
            parse_constant=self._mark(_constant),
            parse_int=self._mark(_long_integer) if long_integers else None,
        )
        self.document = decoder.decode(text)

    def _mark(self, build: Any) -> Any:
        def marked(text: str) -> Any:
            value = build(text)
            self.marked = self.marked or isinstance(value, _Unreadable)
            return value

        return marked

    def _object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        built = dict(pairs)
        if len(built) == len(pairs):
            return built
        self.marked = True
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                return _Repeated(pairs, name)
            seen.add(name)
        raise AssertionError("unreachable: a shorter dict repeats a name")


def location(parts: Iterable[str | int]) -> str:
    """`['messages', 0, 'role']` -> `messages[0].role`."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def path_text(parts: Iterable[str | int]) -> str:
    """`location`, or `body` for the whole document."""
    return location(parts) or "body"


def read(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The document in `raw`, checked as the table above says."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRefused(
            f"The request body is not UTF-8 text (byte {exc.start} is not valid UTF-8).", None
        ) from exc
    if not _within_depth(raw, max_depth):
        raise _too_deep(max_depth)
    decode = _decoded(text, max_depth)
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if decode.marked or (surrogates and _lone(decode.document)) or _long_numbers(raw):
        _Walk(surrogates).check(decode.document)  # find what is wrong, and where
    return decode.document


def _lone(document: Any) -> bool:
    """Whether a lone surrogate is in the (unmarked) document: UTF-8 cannot encode one."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _long_numbers(raw: bytes) -> bool:
    """Whether the text has a digit run or an exponent long enough to leave int64 or float."""
    shape = raw.translate(_NUMBER_SHAPE)
    return any(long in shape for long in _LONG_NUMBERS)


def _decoded(text: str, max_depth: int) -> _Decode:
    try:
        try:
            return _Decode(text)
        except json.JSONDecodeError:
            raise
        except ValueError:  # an integer past Python's digit limit: find it with a marker
            return _Decode(text, long_integers=True)
    except json.JSONDecodeError as exc:
        raise BodyRefused(f"The request body is not valid JSON: {exc}.", None) from exc
    except RecursionError as exc:  # unbalanced brackets past the stack: the scan let it by
        raise _too_deep(max_depth) from exc


def _within_depth(raw: bytes, max_depth: int) -> bool:
    """Whether no container nests deeper than `max_depth`, from the brackets outside strings:
    the most openers not yet closed at any point, in one pass at C speed (a 50,000-deep body
    is refused in a millisecond or two, not by peeling a level at a time).

    Unbalanced text is refused either way: too deep here when it opens more than
    `max_depth` levels, otherwise by the decoder as not JSON.
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return True  # not enough brackets to nest deeper, strings or not
    brackets = _STRING.sub(b"", raw).translate(_STEPS, _NOT_BRACKETS)
    steps = np.frombuffer(brackets, dtype=np.int8).astype(np.int32) - 1  # +1 opens, -1 closes
    return len(steps) == 0 or int(np.cumsum(steps).max()) <= max_depth


def _too_deep(max_depth: int) -> BodyRefused:
    return BodyRefused(
        f"The request body nests arrays and objects more than {max_depth} levels deep.", "body"
    )


class _Walk:
    """One pass over a decoded document (its depth already checked), in document order."""

    def __init__(self, surrogates: bool) -> None:
        self.surrogates = surrogates  # whether the text escapes any surrogate at all

    def check(self, document: Any) -> None:
        stack: list[tuple[tuple[str | int, ...], Any]] = [((), document)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, dict):
                children = self._members(path, value)
            elif isinstance(value, list):
                children = self._items(path, value)
            else:
                self._scalar(path, value)
                continue
            stack.extend(reversed(children))

    def _members(
        self, path: tuple[str | int, ...], obj: dict[str, Any]
    ) -> list[tuple[tuple[str | int, ...], Any]]:
        if isinstance(obj, _Repeated):
            where = path_text((*path, obj.name))
            raise BodyRefused(
                f"`{where}` is given twice in one object: a name may appear only once.", where
            )
        if self.surrogates and any(_SURROGATE.search(name) for name in obj):
            where = path_text(path)
            raise BodyRefused(
                f"A member name in `{where}` holds a lone surrogate escape: not Unicode text.",
                where,
                value=True,
            )
        return [((*path, name), value) for name, value in obj.items()]

    def _items(
        self, path: tuple[str | int, ...], items: list[Any]
    ) -> list[tuple[tuple[str | int, ...], Any]]:
        kinds = set(map(type, items))
        if kinds <= {int} and (not items or INT64[0] <= min(items) <= max(items) <= INT64[1]):
            return []  # token ids: checked at C speed
        if kinds <= {str} and not (self.surrogates and _SURROGATE.search("".join(items))):
            return []
        if kinds <= {float} and all(map(math.isfinite, items)):
            return []
        return [((*path, index), value) for index, value in enumerate(items)]

    def _scalar(self, path: tuple[str | int, ...], value: Any) -> None:
        problem = _problem(value, self.surrogates)
        if problem is not None:
            where = path_text(path)
            raise BodyRefused(f"`{where}` {problem}.", where, value=True)


def _problem(value: Any, surrogates: bool) -> str | None:
    """What is wrong with one scalar, as the end of a sentence; None when nothing is."""
    if isinstance(value, _Unreadable):
        return value.problem
    if isinstance(value, str):
        if surrogates and _SURROGATE.search(value):
            return "holds a lone surrogate escape (\\ud800-\\udfff unpaired): not Unicode text"
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return f"is {_shown(value)}: an integer must lie within the signed 64-bit range"
    if isinstance(value, float) and not math.isfinite(value):
        return "is past the range of a 64-bit float"
    return None


def _shown(value: int) -> str:
    text = str(value)  # at most 4300 digits: a longer literal became an _Unreadable
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def parsed(scope: MutableMapping[str, Any]) -> Any:
    """The document the middleware read for this request (None: the request had no body)."""
    return scope.get(BODY_KEY)
