"""An Anthropic Messages request (`POST /v1/messages`) as the chat request it runs as.

The Messages API is a front end on the chat path (docs/DECISIONS.md, contract 0.22.0): its
`system` and `messages` render as chat messages (blocks.py), its fields become a chat
`GenerationRequest`: `max_tokens`, `stop_sequences` as `stop`, `temperature`, `top_p`,
`top_k`, client `tools` (`input_schema` as `parameters`), `tool_choice` (`auto`, `any` as
`required`, `tool` as a forced function, `none`; `disable_parallel_tool_use` as
`parallel_tool_calls: false`), `thinking` (`enabled` and `adaptive` on, `disabled` off: the
template's switch) and `output_config` (`format` as a json_schema `response_format`,
`effort` as `reasoning_effort`). A refusal of the chat path names the Messages field
(`names`): `output_config.format`, not `response_format`; `messages[2]`, not the chat's
index of the message it became.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...engines.base import ChatPrompt
from ...errors import ApiError, FieldNotHonoured, InvalidParameter
from ...generated import v1
from ..chat.response_format import output_format
from ..chat.thinking import ThinkAsk
from ..chat.tools import tool_ask
from ..completions.requests import GenerationRequest, steering_ask
from ..renames import Renames, renamed_error
from .blocks import conversation

RENAMED: Renames = (
    ("response_format.json_schema.schema", "output_config.format.schema"),
    ("response_format.json_schema", "output_config.format"),
    ("response_format", "output_config.format"),
    ("max_completion_tokens", "max_tokens"),
    ("tool_choice.function", "tool_choice"),
    ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
    ("reasoning_effort", "output_config.effort"),
    ("stop", "stop_sequences"),
)
"""A chat field a refusal names -> the Messages field it came from (first match wins)."""

CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # tool_choice.type -> chat's
CLIENT_TOOLS = (None, "custom")  # a tool's `type` for a client tool; any other is a server's
THINKING = {"enabled": True, "adaptive": True, "disabled": False}  # thinking.type -> think


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesAsk:
    """One Messages request: the chat request it runs as, and how its fields are named."""

    chat: GenerationRequest
    names: Renames  # a chat field's location -> this request's (refusals, reports)
    unused: tuple[str, ...] = ()  # members sent that change nothing (reported)

    def renamed(self, exc: ApiError) -> ApiError:
        """`exc` naming the Messages field its chat field came from."""
        return renamed_error(exc, self.names)


def message_ask(
    req: v1.CreateMessageRequest | v1.CountMessageTokensRequest,
) -> MessagesAsk:
    """`req` as the chat request it runs as; refusals before any load."""
    chat = conversation(req.system, req.messages)
    names = (*((f"messages[{i}]", where) for i, where in enumerate(chat.origin)), *RENAMED)
    try:
        tools = tool_ask(_tools(req), _tool_choice(req), _parallel(req))
        output = output_format(_response_format(req))
    except ApiError as exc:
        raise renamed_error(exc, names) from None
    kwargs = dict(req.chat_template_kwargs or {})
    sent = {f for f in req.model_fields_set if getattr(req, f, None) is not None}
    effort = req.output_config.effort if req.output_config is not None else None
    sampling: dict[str, Any] = {}  # what only a create sends (count_tokens generates nothing)
    if isinstance(req, v1.CreateMessageRequest):
        sampling = {
            "stream": bool(req.stream),
            "continuous_usage": bool(req.stream),  # message_start's input_tokens
            "max_tokens": req.max_tokens,
            "temperature": _number(req.temperature),
            "top_p": _number(req.top_p),
            "top_k": req.top_k,
            "stops": tuple(s for s in (req.stop_sequences or ()) if s),
            "seed": req.seed,
            "steering": steering_ask(req),
            "thinking_budget": _budget(req),
        }
    ask = GenerationRequest(
        endpoint="chat",
        model_id=req.model,
        prompts=(ChatPrompt(tuple(chat.messages), kwargs),),
        n=1,
        stream=False,
        include_usage=True,
        max_tokens=None,
        temperature=None,
        top_p=None,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        stops=(),
        seed=None,
        tools=tools,
        output=output,
        think=ThinkAsk(_think(req), kwargs.get("enable_thinking"), effort),
        sent=frozenset(sent),
    )
    think_names = (("think", "thinking"),) if req.think is None else ()  # its report's name
    ask = replace(ask, names=(*names, *think_names), **sampling)
    return MessagesAsk(chat=ask, names=names, unused=(*chat.unused, *_unused(req)))


def _unused(req: v1.CreateMessageRequest | v1.CountMessageTokensRequest) -> list[str]:
    """Nested members the field matrix does not see that change nothing here: the thinking's
    `display`, and its `budget_tokens` where nothing is generated (count_tokens) or thinking
    is not `enabled`. (`metadata` the matrix reports whole.)"""
    found = []
    budget = req.thinking is not None and req.thinking.budget_tokens is not None
    if budget and (isinstance(req, v1.CountMessageTokensRequest) or _budget(req) is None):
        found.append("thinking.budget_tokens")
    if req.thinking is not None and req.thinking.display is not None:
        found.append("thinking.display")
    return found


def _budget(req: v1.CreateMessageRequest | v1.CountMessageTokensRequest) -> int | None:
    """`thinking.budget_tokens` where thinking is `enabled` (and miserver's `think` does not
    turn it off): the most tokens the reply's reasoning span may hold."""
    thinking = req.thinking
    if thinking is None or thinking.type != "enabled" or req.think is False:
        return None
    return thinking.budget_tokens


def _think(req: v1.CreateMessageRequest | v1.CountMessageTokensRequest) -> bool | None:
    """miserver's own `think` first, then `thinking.type`."""
    if req.think is not None:
        return req.think
    return None if req.thinking is None else THINKING[req.thinking.type]


def _tools(
    req: v1.CreateMessageRequest | v1.CountMessageTokensRequest,
) -> list[dict[str, Any]] | None:
    """The client tools as chat's `{type, function: {...}}`; a server tool refused."""
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type not in CLIENT_TOOLS:
            raise FieldNotHonoured(
                f"tools[{i}].type",
                f"on messages: server tools (`{tool.type}`; this server calls client tools, "
                "which have `name`, `description` and `input_schema`)",
            )
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema or {"type": "object", "properties": {}}
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(req: v1.CreateMessageRequest | v1.CountMessageTokensRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type != "tool":
        return CHOICES[choice.type]
    if not choice.name:
        raise InvalidParameter("tool_choice.name", 'A tool_choice of type "tool" names the tool.')
    return {"type": "function", "function": {"name": choice.name}}


def _parallel(req: v1.CreateMessageRequest | v1.CountMessageTokensRequest) -> bool | None:
    choice = req.tool_choice
    if choice is None or choice.disable_parallel_tool_use is None:
        return None
    return not choice.disable_parallel_tool_use


def _response_format(
    req: v1.CreateMessageRequest | v1.CountMessageTokensRequest,
) -> Mapping[str, Any] | None:
    """`output_config.format` as chat's json_schema `response_format`."""
    config = req.output_config
    if config is None or config.format is None:
        return None
    spec: dict[str, Any] = {"name": "output", "strict": True}
    if config.format.schema_ is not None:
        spec["schema"] = config.format.schema_.model_dump(mode="json", by_alias=True)
    return {"type": "json_schema", "json_schema": spec}


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


def stop_reason(finish: str | None, stop: str | None) -> str | None:
    """Anthropic's `stop_reason` for a chat choice's end (None: not ended)."""
    if finish is None:
        return None
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop is not None else "end_turn"
