"""The generic call format: function calling on a chat template that takes no tools.

llama.cpp's server has a format by that name. A template that never reads
`tools` (SmolLM2's), or no template at all, can neither show tools nor write
a call, so the server does both (the wording is data,
spec/policy/tool_call_formats.yaml):

- `shown()`: the tool list and how to answer go into the system turn, after
  any system message;
- `schema()`: the reply is constrained to one JSON document,
  `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}` or
  `{"content": "..."}`; `GenericFormat.parse` reads it back;
- `plain_history()`: tool history becomes turns any template takes: an
  assistant's calls are its calls document, and consecutive `tool` results
  are one user turn `{"tool_results": [{"name": ..., "content": ...}]}`.

A stream sends a content document's text as it is decoded and holds a calls
document whole (`DocumentBuffer`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from itertools import islice
from string import Template
from typing import Any

import yaml

from ...engines.base import ChatPrompt, PromptError
from ...engines.chatmessages import content_text
from .call_formats import Malformed, ParsedReply, checked_call, json_at

NAME = "generic"
CALLS, CONTENT, RESULTS = "tool_calls", "content", "tool_results"
_TOOL_ROLES = frozenset({"tool", "function"})
_SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Wording:
    """The system turn's text: the list's heading, and how to answer by tool_choice."""

    tools: str
    answer: Mapping[str, str]  # auto, required, function: `$calls`, `$name` substituted
    calls: Mapping[str, str]  # many, one


@cache
def wording() -> Wording:
    """The `generic` row of spec/policy/tool_call_formats.yaml."""
    path = resources.files("miserver.spec") / "policy" / "tool_call_formats.yaml"
    row = yaml.safe_load(path.read_text("utf-8"))["generic"]
    return Wording(str(row["tools"]), dict(row["answer"]), dict(row["calls"]))


# -- the prompt


def system_text(
    tools: Sequence[Mapping[str, Any]], choice: str, name: str | None, limit: int | None
) -> str:
    """The tools, one JSON line each, and how to answer for this tool_choice."""
    words = wording()
    listed = [json.dumps(dict(tool["function"]), ensure_ascii=False) for tool in tools]
    calls = words.calls["one" if limit == 1 else "many"]
    answer = Template(words.answer[choice]).substitute(calls=calls, name=name or "")
    return "\n".join([words.tools, *listed, answer])


def shown(prompt: ChatPrompt, system: str) -> ChatPrompt:
    """The chat with `system` closing its system turn and its history as documents."""
    messages = plain_history(prompt.messages, documents=True)
    if messages and messages[0].get("role") in _SYSTEM_ROLES:
        first = content_text(messages[0].get("content"))
        merged = f"{first}\n\n{system}" if first else system
        messages[0] = {**messages[0], "content": merged}
    else:
        messages.insert(0, {"role": "system", "content": system})
    return replace(prompt, messages=tuple(messages))


def has_tool_history(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message is a call or a tool result."""
    return any(m.get("tool_calls") or m.get("role") in _TOOL_ROLES for m in messages)


def plain_history(
    messages: Sequence[Mapping[str, Any]], *, documents: bool
) -> list[dict[str, Any]]:
    """Calls and tool results as plain turns; with `documents` (the tools are shown, the reply
    is a document) every earlier assistant answer is a content document too."""
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> the function it called
    for i, message in enumerate(messages):
        if message.get("role") in _TOOL_ROLES:
            results.append(_result(message, names, i))
            continue
        if results:
            out.append(_results_turn(results))
            results = []
        wrap = documents and i < len(messages) - 1  # a trailing one is a partial answer
        if message.get("role") == "assistant" and (message.get("tool_calls") or wrap):
            names.update(_called(message, i))
            out.append(_answer(message, i))
        else:
            out.append(dict(message))
    if results:
        out.append(_results_turn(results))
    return out


def _called(message: Mapping[str, Any], i: int) -> dict[str, str]:
    return {
        str(call["id"]): name
        for call, name in zip(message.get("tool_calls") or (), _names(message, i), strict=True)
        if call.get("id")
    }


def _names(message: Mapping[str, Any], i: int) -> list[str]:
    names = []
    for j, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise PromptError("a call needs a function name", f"messages[{i}].tool_calls[{j}]")
        names.append(function["name"])
    return names


def _answer(message: Mapping[str, Any], i: int) -> dict[str, Any]:
    """An assistant turn as a document: its calls, else its content."""
    text = _text(message, i)
    calls = message.get("tool_calls") or ()
    rest = {k: v for k, v in message.items() if k not in {CALLS, CONTENT}}
    if not calls:
        return {**rest, CONTENT: _dumps({CONTENT: text})}
    names = _names(message, i)
    document = _dumps(
        {
            CALLS: [
                {"name": n, "arguments": _arguments(c)} for n, c in zip(names, calls, strict=True)
            ]
        }
    )
    return {**rest, CONTENT: f"{text}\n{document}" if text else document}


def _arguments(call: Mapping[str, Any]) -> Any:
    """A history call's arguments as the object they encode (a string that is not JSON as is)."""
    value = call["function"].get("arguments")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return {} if value is None else value


def _result(message: Mapping[str, Any], names: Mapping[str, str], i: int) -> dict[str, Any]:
    name = message.get("name") or names.get(str(message.get("tool_call_id")))
    return {"name": name, CONTENT: _text(message, i)} if name else {CONTENT: _text(message, i)}


def _results_turn(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", CONTENT: _dumps({RESULTS: results})}


def _text(message: Mapping[str, Any], i: int) -> str:
    try:
        return content_text(message.get("content"))
    except PromptError as exc:
        raise PromptError(str(exc), f"messages[{i}].content") from exc


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- the constraint


def schema(
    parameters: Mapping[str, Any], choice: str, name: str | None, limit: int | None
) -> dict[str, Any]:
    """The reply's JSON Schema: a calls document (each function's name and its `parameters`),
    or, with tool_choice auto, a content document instead."""
    defs: dict[str, Any] = {}
    chosen = {name: parameters[name]} if name is not None else parameters
    items = [
        _obj({"name": {"type": "string", "const": n}, "arguments": _hoisted(p, f"f{i}_", defs)})
        for i, (n, p) in enumerate(chosen.items())
    ]
    array: dict[str, Any] = {
        "type": "array",
        "items": items[0] if len(items) == 1 else {"anyOf": items},
        "minItems": 1,
    }
    if limit is not None:
        array["maxItems"] = limit
    calls = _obj({CALLS: array})
    root = calls if choice != "auto" else {"anyOf": [calls, _obj({CONTENT: {"type": "string"}})]}
    return {**root, "$defs": defs} if defs else root


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _hoisted(parameters: Mapping[str, Any], prefix: str, defs: dict[str, Any]) -> Any:
    """`parameters` less its `$defs`, which move to `defs` under `prefix` (its local `$ref`s
    follow), so it can sit inside the document's schema."""
    own = parameters.get("$defs")
    body = {k: v for k, v in parameters.items() if k != "$defs"}
    if isinstance(own, Mapping):
        defs.update({prefix + k: _retargeted(v, prefix) for k, v in own.items()})
    return _retargeted(body, prefix)


def _retargeted(value: Any, prefix: str) -> Any:
    if isinstance(value, Mapping):
        out = {k: _retargeted(v, prefix) for k, v in value.items()}
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            out["$ref"] = "#/$defs/" + prefix + ref.removeprefix("#/$defs/")
        return out
    if isinstance(value, list):
        return [_retargeted(v, prefix) for v in value]
    return value


# -- the reply


_CONTENT_OPENING = re.compile(r'\s*\{\s*"content"\s*:\s*"')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*', re.DOTALL)
_LONGEST_ESCAPE = len("\\u0000")


def content_so_far(text: str) -> str | None:
    """The decoded text of a content document, whole or cut short; None: not one."""
    opening = _CONTENT_OPENING.match(text)
    if opening is None:
        return None
    body = _STRING_BODY.match(text, opening.end())
    chunk = text[opening.end() : body.end() if body else opening.end()]
    for cut in range(min(len(chunk), _LONGEST_ESCAPE) + 1):
        try:
            decoded: str = json.loads(f'"{chunk[: len(chunk) - cut]}"')
        except ValueError:
            continue
        if decoded and "\ud800" <= decoded[-1] <= "\udbff":  # half a surrogate pair
            decoded = decoded[:-1]
        return decoded
    return ""


@dataclass(frozen=True, slots=True)
class GenericFormat:
    """The reply is one JSON document: calls, or content."""

    name: str = NAME

    def parse(self, text: str, offered: frozenset[str], limit: int | None) -> ParsedReply | None:
        """The calls or the content of a document (one cut short: its content so far); None:
        the reply is not a document and is plain content (OAI-TOOLS-21)."""
        try:
            document, _ = json_at(text, 0, whole=True)
        except Malformed:
            partial = content_so_far(text)
            return None if partial is None else ParsedReply(partial, ())
        if not isinstance(document, dict):
            return None
        if set(document) == {CONTENT} and isinstance(document[CONTENT], str):
            return ParsedReply(document[CONTENT], ())
        calls = document.get(CALLS)
        if set(document) != {CALLS} or not isinstance(calls, list) or not calls:
            return None
        try:
            return ParsedReply(None, tuple(_call(c, offered) for c in islice(calls, limit)))
        except Malformed:
            return None


def _call(call: object, offered: frozenset[str]) -> Any:
    if not isinstance(call, dict):
        raise Malformed("a call is not an object")
    return checked_call(call.get("name"), call.get("arguments", {}), offered)


GENERIC = GenericFormat()


class DocumentBuffer:
    """A streamed document: a content document's text released as it is decoded, anything
    else held."""

    def __init__(self) -> None:
        self._text = ""
        self._sent = ""

    def push(self, text: str) -> str:
        """Content safe to send now."""
        self._text += text
        so_far = content_so_far(self._text)
        if so_far is None or not so_far.startswith(self._sent):
            return ""
        out = so_far[len(self._sent) :]
        self._sent = so_far
        return out

    @property
    def text(self) -> str:
        """The whole reply so far."""
        return self._text

    def rest(self) -> str:
        """The content not yet sent, once the reply holds no call: a content document's text,
        else the raw reply (OAI-TOOLS-21)."""
        content = content_so_far(self._text)
        whole = self._text if content is None else content
        out = whole[len(self._sent) :] if whole.startswith(self._sent) else whole
        self._sent = whole
        return out
