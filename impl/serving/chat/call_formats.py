"""Function-calling call formats and reply parsers (OAI-TOOLS-08).

The formats are data (spec/policy/tool_call_formats.yaml): the markers that pick
a model's format off its chat template, and the openings that force a call.
A format's name picks its reader in `_READERS`. A reader finds where the calls
start and yields them as (name, arguments) pairs, raising `Malformed` on one
that does not parse; `CallFormat.parse` checks them against the offered
functions. A reply that does not parse is plain content: `parse` returns None,
it never raises (OAI-TOOLS-21).
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from itertools import islice
from string import Template
from types import MappingProxyType
from typing import Any, TypeGuard

import jinja2
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import yaml
from jinja2.ext import Extension

from ..stops import held_tail


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # the JSON text of an object


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A reply read back: its content and its calls.

    A template format's reply has at least one call, its content the text
    before the first, stripped (None when empty). A generic document
    (generic.py) has either calls (content None) or only content.
    """

    content: str | None
    calls: tuple[ToolCall, ...]


class Malformed(Exception):
    """A call that does not parse: the reply is then plain content."""


Calls = Iterator[tuple[object, object]]
Reader = Callable[[str], tuple[str, Calls] | None]  # None: no call starts in the text


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFormat:
    name: str
    markers: tuple[str, ...]  # any of these in the template text selects this format
    quote_name: str  # a key of _QUOTES
    required: str  # the opening for tool_choice "required"
    named: str  # the opening for a forced function, `$name` in place of its name
    starts: tuple[str, ...] = ()  # texts that begin a call in a reply
    after_name: str | None = None  # between a forced call's name and its arguments (JSON)
    tail: str | None = None  # after a forced call's arguments; None: not constrained
    whole_reply: bool = False  # a call is the whole reply: it can only start at its start

    def opening(self, name: str | None) -> str:
        """Text after the generation prompt that opens a call (OAI-TOOLS-14)."""
        if name is None:
            return self.required
        return Template(self.named).substitute(name=_QUOTES[self.quote_name](name))

    def forced(self, schemas: Mapping[str, Any], name: str | None) -> dict[str, Any] | None:
        """What may follow a forced call's opening: the payload of a `call` constraint.

        Named: the arguments (a JSON document under the function's parameters
        schema), then the tail. Required: one offered function's name, then its
        arguments, then the tail. None when the format's arguments are not JSON.
        """
        if self.tail is None or self.after_name is None:
            return None
        if name is not None:
            options = [["", schemas[name]]]
        else:
            quote = _QUOTES[self.quote_name]
            options = [[quote(n) + self.after_name, schema] for n, schema in schemas.items()]
        return {"options": options, "tail": self.tail}

    def safe_prefix(self, text: str) -> tuple[int, bool]:
        """How much of a reply so far cannot belong to a call, and whether a call may have
        begun (from then on everything is held, OAI-TOOLS-05)."""
        if self.whole_reply:
            body = text.lstrip()
            if not body:
                return 0, False
            begins = any(s.startswith(body[: len(s)]) for s in self.starts)
            return (0, True) if begins else (len(text), False)
        found = [at for at in (text.find(s) for s in self.starts) if at >= 0]
        if found:
            return min(found), True
        return len(text) - held_tail(text, self.starts), False

    def parse(self, text: str, offered: frozenset[str], limit: int | None) -> ParsedReply | None:
        """The calls in a reply (opening included), at most `limit`; None: plain content."""
        found = _READERS[self.name](text)
        if found is None:
            return None
        head, raw = found
        try:
            calls = tuple(checked_call(name, args, offered) for name, args in islice(raw, limit))
        except Malformed:
            return None
        return ParsedReply(head.strip() or None, calls) if calls else None


@lru_cache(maxsize=16)
def takes_tools(template: str) -> bool:
    """Whether a chat template reads the `tools` variable; one that does not gets the generic
    format (generic.py)."""
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", _Generation])
    try:
        tree = environment.parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(tree)


def format_of(template: str) -> CallFormat | None:
    """The call format a chat template writes, None when none is recognised (OAI-TOOLS-11)."""
    return next(
        (f for f in FORMATS.values() if any(marker in template for marker in f.markers)), None
    )


class _Generation(Extension):
    """transformers' `{% generation %}` block (assistant token masks), read as a plain block."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares a plain class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


# -- checks common to every format


def checked_call(name: object, arguments: object, offered: frozenset[str]) -> ToolCall:
    """A call to an offered function with an object of arguments (a JSON string of one is
    read); raises Malformed."""
    if not isinstance(name, str) or name not in offered:
        raise Malformed(f"no offered function {name!r}")
    if isinstance(arguments, str):
        arguments = json_at(arguments, 0, whole=True)[0]
    if not isinstance(arguments, dict):
        raise Malformed("arguments are not an object")
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _no_constant(token: str) -> Any:
    raise Malformed(f"{token} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def json_at(text: str, start: int, whole: bool = False) -> tuple[object, int]:
    """The JSON value after any whitespace at `start`, and the index after it."""
    start = _skip_space(text, start)
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError) as error:
        raise Malformed(str(error)) from error
    if whole and _skip_space(text, end) != len(text):
        raise Malformed("text after the JSON value")
    return value, end


def _skip_space(text: str, start: int) -> int:
    rest = text[start:]
    return start + len(rest) - len(rest.lstrip())


# -- hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block a call

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def _hermes(text: str) -> tuple[str, Calls] | None:
    first = text.find(HERMES_OPEN)
    return None if first < 0 else (text[:first], _hermes_calls(text, first))


def _hermes_calls(text: str, at: int) -> Calls:
    while at >= 0:
        value, end = json_at(text, at + len(HERMES_OPEN))
        rest = text[end:].lstrip()
        if rest and not rest.startswith(HERMES_CLOSE):  # unclosed only at the very end
            raise Malformed("a call block is not closed")
        if not isinstance(value, dict):
            raise Malformed("a call is not an object")
        yield value.get("name"), value.get("arguments", {})
        at = text.find(HERMES_OPEN, end)


# -- lfm2: <|tool_call_start|>[f(a='x'), g()]<|tool_call_end|>, Python syntax read by `ast`

LFM2_OPEN, LFM2_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"

_NAMES: Mapping[str, object] = {
    "True": True,
    "False": False,
    "None": None,
    "true": True,
    "false": False,
    "null": None,
}


def _lfm2(text: str) -> tuple[str, Calls] | None:
    first = text.find(LFM2_OPEN)
    return None if first < 0 else (text[:first], _lfm2_calls(text, first))


def _lfm2_calls(text: str, at: int) -> Calls:
    while at >= 0:
        start = at + len(LFM2_OPEN)
        end = text.find(LFM2_CLOSE, start)
        yield from _python_calls(text[start:] if end < 0 else text[start:end])
        at = -1 if end < 0 else text.find(LFM2_OPEN, end)


def _python_calls(body: str) -> Calls:
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise Malformed(str(error)) from error
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        yield _python_call(node)


def _python_call(node: ast.expr) -> tuple[str, dict[str, object]]:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        raise Malformed("not a call with keyword arguments")
    arguments: dict[str, object] = {}
    for keyword in node.keywords:
        value = _literal(keyword.value)
        if keyword.arg is not None:
            arguments[keyword.arg] = value
        elif isinstance(value, dict):  # f(**{'a': 1})
            arguments.update(value)
        else:
            raise Malformed("** of a non-mapping")
    return node.func.id, arguments


def _literal(node: ast.expr) -> object:
    """A Python literal as a JSON value (never eval)."""
    match node:
        case ast.Constant(value=value) if _is_scalar(value):
            return value
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=value)) if _is_number(value):
            return -value
        case ast.Name(id=name) if name in _NAMES:
            return _NAMES[name]
        case ast.List(elts=items) | ast.Tuple(elts=items):
            return [_literal(item) for item in items]
        case ast.Dict(keys=keys, values=values):
            return {_key(key): _literal(value) for key, value in zip(keys, values, strict=True)}
    raise Malformed(f"not a literal: {ast.dump(node)}")


def _key(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise Malformed("a mapping key is not a string")


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | bool) or _is_number(value)


def _is_number(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


# -- llama3: the whole reply is {"name": ..., "parameters": {...}}, calls joined by `;`

LLAMA3_TAG = "<|python_tag|>"


def _llama3(text: str) -> tuple[str, Calls] | None:
    body = text.strip().removeprefix(LLAMA3_TAG).lstrip()
    return ("", _llama3_calls(body)) if body.startswith("{") else None


def _llama3_calls(body: str) -> Calls:
    at = 0
    while True:
        value, at = json_at(body, at)
        if not isinstance(value, dict):
            raise Malformed("a call is not an object")
        yield value.get("name"), value.get("parameters", value.get("arguments", {}))
        at = _skip_space(body, at)
        if at == len(body):
            return
        if body[at] != ";":
            raise Malformed("text after a call")
        at += 1


# -- the tables


_READERS: Mapping[str, Reader] = {"hermes": _hermes, "lfm2": _lfm2, "llama3": _llama3}

_QUOTES: Mapping[str, Callable[[str], str]] = {
    "json": lambda name: json.dumps(name, ensure_ascii=False)[1:-1],
    "python": lambda name: name,
}


@cache
def formats() -> Mapping[str, CallFormat]:
    """The call formats of spec/policy/tool_call_formats.yaml, in its order."""
    path = resources.files("miserver.spec") / "policy" / "tool_call_formats.yaml"
    rows = yaml.safe_load(path.read_text("utf-8"))["formats"]
    table = {
        row["name"]: CallFormat(
            name=row["name"],
            markers=tuple(row["markers"]),
            quote_name=row["quote_name"],
            required=row["opening"]["required"],
            named=row["opening"]["named"],
            starts=tuple(row["starts"]),
            whole_reply=bool(row.get("whole_reply", False)),
            after_name=row.get("forced", {}).get("after_name"),
            tail=row.get("forced", {}).get("tail"),
        )
        for row in rows
    }
    unknown = [f"{f.name}/{f.quote_name}" for f in table.values() if not _known(f)]
    if unknown:
        raise ValueError(f"tool_call_formats.yaml: no reader or quoting for {unknown}")
    return MappingProxyType(table)


def _known(call_format: CallFormat) -> bool:
    return call_format.name in _READERS and call_format.quote_name in _QUOTES


FORMATS: Mapping[str, CallFormat] = formats()
