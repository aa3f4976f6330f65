"""Function calling on chat (OAI-TOOLS): the ask, the plan against a model, the reply.

`tool_ask()` reads `tools`, `tool_choice` and `parallel_tool_calls` before
any load. Once the model is resident, `tool_plan()` reads its call format off
its chat template (call_formats.py), and fixes the opening a forced call appends
to the render (OAI-TOOLS-14) and, where the format's arguments are JSON,
the grammar of what follows it, so a forced call always parses. A template
that takes no tools (or none at all) gets the generic format (generic.py):
the server shows the tools and the reply is one constrained JSON document. A
template that takes tools in a format none of these read refuses them
(OAI-TOOLS-24). The reply is parsed back into OpenAI `tool_calls`; one that
does not parse is plain content (OAI-TOOLS-21). `CallBuffer` lets a stream
send the text before a call as content and hold the call itself
(OAI-TOOLS-05).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ... import headers as hdr
from ...engines.base import ChatPrompt, Constraint
from ...engines.chatmessages import content_text
from ...errors import FieldNotHonoured, InvalidParameter
from ..prompts import Prompt
from . import generic, schema_subset
from .call_formats import CallFormat, ParsedReply, ToolCall, format_of, takes_tools
from .generic import GENERIC, DocumentBuffer, GenericFormat


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolAsk:
    """What the request asks: the tools, how to choose (auto, none, required, function)."""

    tools: tuple[Mapping[str, Any], ...]
    choice: str
    name: str | None = None
    limit: int | None = None  # 1: parallel_tool_calls false (OAI-TOOLS-17) or a named choice
    parallel: bool = False  # parallel_tool_calls sent as true (the generic format's opt-in)

    @property
    def forced(self) -> bool:
        """A call is required: the reply opens with one (OAI-TOOLS-14)."""
        return self.choice in {"required", "function"}

    @property
    def names(self) -> frozenset[str]:
        return frozenset(str(t["function"]["name"]) for t in self.tools)

    @property
    def parameters(self) -> dict[str, Any]:
        """Each function's parameters schema, as a forced call's grammar enforces it.

        A schema is enforced less the keywords outside the server's subset
        (`schema_subset.within`: LangChain's tools carry `exclusiveMinimum`), and
        one still outside it (a bad type, a limit passed) as any JSON object:
        tool definitions are the client's, not refused here.
        """
        out: dict[str, Any] = {}
        for tool in self.tools:
            schema = schema_subset.within(tool["function"].get("parameters"))
            usable = isinstance(schema, Mapping) and not schema_subset.problems(schema)
            out[str(tool["function"]["name"])] = closed(schema) if usable else {"type": "object"}
        return out


def tool_ask(
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
) -> ToolAsk | None:
    """The request's `tools`, `tool_choice` and `parallel_tool_calls` (as JSON values);
    None when it sends no tools. Refusals before any load."""
    choice, parallel = tool_choice, parallel_tool_calls
    tools = tuple(tools or ())
    if not tools:
        if choice is None or choice == "none":
            return None
        raise InvalidParameter("tool_choice", "tool_choice needs `tools` to choose from.")
    names = [str(t["function"]["name"]) for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidParameter("tools", f"Function names must be unique; repeated: {twice}.")
    limit = 1 if parallel is False else None
    if isinstance(choice, Mapping):
        name = str(choice["function"]["name"])
        if name not in names:
            raise InvalidParameter(
                "tool_choice",
                f"tool_choice forces `{name}`, which is not in `tools` ({', '.join(names)}).",
            )
        return ToolAsk(
            tools=tools, choice="function", name=name, limit=1, parallel=parallel is True
        )  # one named call
    return ToolAsk(
        tools=tools, choice=str(choice or "auto"), name=None, limit=limit, parallel=parallel is True
    )


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """A tool request made concrete against the model's template."""

    ask: ToolAsk
    format: CallFormat | GenericFormat
    opening: str
    constraint: Constraint | None = None  # a forced call's continuation, or the document

    def prompt(self, prompt: ChatPrompt) -> ChatPrompt:
        """The chat with its tools shown (by the template, or by the server for the generic
        format) and a forced call opened."""
        if isinstance(self.format, GenericFormat):
            ask = self.ask
            return generic.shown(
                prompt, generic.system_text(ask.tools, ask.choice, ask.name, ask.limit)
            )
        return replace(prompt, tools=self.ask.tools, opening=self.opening)

    def parse(self, text: str) -> ParsedReply | None:
        """The calls in a reply (or a generic document's content), or None: the reply is
        plain content (OAI-TOOLS-21)."""
        return self.format.parse(self.opening + text, self.ask.names, self.ask.limit)

    def buffer(self) -> CallBuffer | DocumentBuffer:
        if isinstance(self.format, GenericFormat):
            return DocumentBuffer()
        return CallBuffer(self.format, forced=bool(self.opening))

    def loosened(self) -> ToolPlan:
        """The plan once the engine refused its constraint: a generic document with any object
        as arguments, else unconstrained (a forced call stays forced by its opening)."""
        loose = _document(self.ask, loose=True)
        if isinstance(self.format, GenericFormat) and self.constraint != loose:
            return replace(self, constraint=loose)
        return replace(self, constraint=None)


def tool_plan(
    ask: ToolAsk | None, template: str | None, prompt: Prompt | None = None
) -> ToolPlan | None:
    """The plan for a resident model and the chat `prompt`; raises field_not_honoured naming
    `tools`.

    `tool_choice: "none"` does not show the tools, so the model cannot call
    one: the chat is served as a plain chat (OAI-TOOLS-13). So is a chat
    whose partial answer (OAI-CONT-01) has begun as text where the generic
    format is served: its reply is one document from the start of the turn,
    so a reply begun as text can only go on as text (an agent at its step
    limit sends such a partial, "respond with text only"), and a forced call
    is refused.
    """
    if ask is None or ask.choice == "none":
        return None
    if template is None or not takes_tools(template):
        if begun_as_text(prompt):
            if ask.forced:
                raise InvalidParameter(
                    "tool_choice",
                    "tool_choice forces a call, but the last message is a partial answer begun "
                    "as text, and this model's calls (the generic format) must begin the reply.",
                )
            return None
        # one call unless parallel calls are asked for, as llama.cpp's server does: a model
        # never taught to call tools repeats a call until max_tokens when the list is open
        ask = ask if ask.parallel else replace(ask, limit=1)
        return ToolPlan(ask, GENERIC, "", _document(ask))
    call_format = format_of(template)
    if call_format is None:
        raise FieldNotHonoured(
            "tools",
            "by this model: its chat template writes calls in a format this server does not "
            "recognise (it reads LFM2, Hermes/Qwen2.5 and Llama 3 calls)",
        )
    if not ask.forced:
        return ToolPlan(ask, call_format, "")
    forced = call_format.forced(ask.parameters, ask.name)
    constraint = None if forced is None else Constraint(json.dumps(forced), "call")
    return ToolPlan(ask, call_format, call_format.opening(ask.name), constraint)


def begun_as_text(prompt: Prompt | None) -> bool:
    """Whether a chat ends in a partial answer (a trailing assistant message, OAI-CONT-01) that
    has begun as text: not empty, not the start of a JSON document, and calling nothing."""
    if not isinstance(prompt, ChatPrompt) or not prompt.messages:
        return False
    last = prompt.messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return False
    text = content_text(last.get("content")).lstrip()
    return bool(text) and not text.startswith("{")


def closed(schema: Any) -> Any:
    """`schema` with every object that lists `properties` and says nothing of others closed
    (`additionalProperties: false`): arguments hold what the function declares, as llama.cpp's
    grammars read a schema, so a small model cannot add keys or copy schema text."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMAS else v for k, v in schema.items()}
    for k in ("properties", "$defs"):
        if isinstance(schema.get(k), Mapping):
            out[k] = {name: closed(v) for name, v in schema[k].items()}
    if isinstance(schema.get("properties"), Mapping) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


_SUBSCHEMAS = frozenset({"items", "anyOf", "oneOf", "allOf"})


def _document(ask: ToolAsk, *, loose: bool = False) -> Constraint:
    """The generic reply's constraint; `loose`: any object as every function's arguments."""
    parameters = {n: {"type": "object"} for n in ask.parameters} if loose else ask.parameters
    schema = generic.schema(parameters, ask.choice, ask.name, ask.limit)
    return Constraint(json.dumps(schema, separators=(",", ":")))


def shown(
    plan: ToolPlan | None, prompt: ChatPrompt, template: str | None, honoured: bool
) -> ChatPrompt:
    """The chat the model is given. With a plan: its tools shown. Without one, a template that
    takes no tools still gets its tool history from the server, as the generic format renders
    it, where the engine honours tools (`honoured`): a call or a result is never dropped."""
    if plan is not None:
        return plan.prompt(prompt)
    generic_model = template is None or not takes_tools(template)
    if honoured and generic_model and generic.has_tool_history(prompt.messages):
        return replace(
            prompt, messages=tuple(generic.plain_history(prompt.messages, documents=False))
        )
    return prompt


def format_header(plan: ToolPlan | None) -> dict[str, str]:
    """X-miLLM-Tool-Format: the call format the tools were shown and read in; no header where
    none were shown (no tools, or tool_choice "none")."""
    return {} if plan is None else {hdr.TOOL_FORMAT: plan.format.name}


def wire_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` (OAI-TOOLS-04), each with a fresh `call_` id."""
    return [
        {
            "index": i,
            "id": "call_" + secrets.token_hex(12),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


class CallBuffer:
    """A streamed reply: what cannot belong to a call is released, the rest held.

    Held from the first call marker on (or a tail that may begin one); a
    format whose call is the whole reply holds a reply that begins like one;
    a forced call holds everything.
    """

    def __init__(self, call_format: CallFormat, forced: bool) -> None:
        self._format = call_format
        self._text = ""
        self._sent = 0
        self._holding = forced

    def push(self, text: str) -> str:
        """Text safe to send as content now."""
        self._text += text
        if self._holding:
            return ""
        safe, self._holding = self._format.safe_prefix(self._text)
        out = self._text[self._sent : safe]
        self._sent = max(self._sent, safe)
        return out

    @property
    def text(self) -> str:
        """The whole reply so far."""
        return self._text

    def rest(self) -> str:
        """What is held, released as content when the reply holds no call."""
        out = self._text[self._sent :]
        self._sent = len(self._text)
        return out
