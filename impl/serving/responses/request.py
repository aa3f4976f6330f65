"""A Responses API request (`POST /v1/responses`) as the chat request it runs as.

The Responses API is a front end on the chat path (docs/DECISIONS.md, contract 0.20.0): its
conversation (the stored one `previous_response_id` names, then `input`) renders as chat
messages (items.py), its fields become a chat `GenerationRequest`, and what the Response
object echoes is kept beside it in `ResponseAsk`. The refusals are the chat path's, each
naming the Responses field (`RENAMED`): `text.format`, not `response_format`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...engines.base import ChatPrompt
from ...errors import ApiError, FieldNotHonoured, InvalidParameter
from ...generated import v1
from ..chat.response_format import output_format
from ..chat.thinking import ThinkAsk
from ..chat.tools import tool_ask
from ..completions.defaults import RequestDefaults
from ..completions.requests import GenerationRequest, steering_ask
from ..prompts import value_of
from ..renames import Renames, matched
from . import items as items_mod

LOGPROBS = "message.output_text.logprobs"  # the `include` value that reports logprobs

RENAMED: Renames = (
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("tool_choice.function", "tool_choice"),
    ("messages", "input"),
    ("reasoning_effort", "reasoning.effort"),
    ("logprobs", "include"),
)
"""A chat field a refusal names -> the Responses field it came from (first match wins)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseAsk:
    """One Responses request: the chat request it runs as, and what its Response keeps."""

    chat: GenerationRequest
    input_items: tuple[dict[str, Any], ...]  # this request's input, each item with its id
    conversation: tuple[dict[str, Any], ...]  # what the model sees: the previous, then input
    echo: dict[str, Any] = field(default_factory=dict)  # the Response's request members
    store: bool = True
    unused: tuple[str, ...] = ()  # nested members sent that change nothing (reported)


def response_ask(
    req: v1.CreateResponseRequest, previous: Sequence[dict[str, Any]] = ()
) -> ResponseAsk:
    """`req` on the conversation `previous` (the stored context its `previous_response_id`
    names); refusals before any load. With `truncation: "auto"` the oldest turns are
    dropped where the whole does not fit the window (chat/truncation.py)."""
    given = items_mod.items(_sent(value_of(req.input)))
    if not given:
        raise InvalidParameter("input", "A response needs `input`: text, or a list of items.")
    conversation = (*previous, *given)
    messages = items_mod.messages(conversation, req.instructions)
    text_format = _sent(req.text.format if req.text is not None else None)
    logprobs = LOGPROBS in set(req.include or ()) or bool(req.top_logprobs)
    effort = req.reasoning.effort if req.reasoning is not None else None
    return ResponseAsk(
        chat=_chat(req, messages, text_format, effort, logprobs),
        input_items=tuple(given),
        conversation=tuple(conversation),
        echo=_echo(req, text_format, effort),
        store=req.store is not False,
        unused=tuple(_unused(req)),
    )


def sampled(ask: ResponseAsk, defaults: RequestDefaults) -> ResponseAsk:
    """`ask` with the config's temperature and top_p where the request sends none, in the
    chat request it runs as and in what its Response echoes (as OpenAI's shows 1.0)."""
    chat = ask.chat
    temperature = defaults.temperature if chat.temperature is None else chat.temperature
    top_p = defaults.top_p if chat.top_p is None else chat.top_p
    echo = {**ask.echo, "temperature": temperature, "top_p": top_p}
    return replace(ask, chat=replace(chat, temperature=temperature, top_p=top_p), echo=echo)


def _unused(req: v1.CreateResponseRequest) -> list[str]:
    """Nested members the field matrix does not see that change nothing here: `text.verbosity`
    (no template reads it), a reasoning summary (nothing summarises), `include` values other
    than the logprobs one."""
    found = []
    if req.text is not None and req.text.verbosity is not None:
        found.append("text.verbosity")
    for name in ("summary", "generate_summary"):
        if req.reasoning is not None and getattr(req.reasoning, name) is not None:
            found.append(f"reasoning.{name}")
    found += [f"include[{i}]" for i, value in enumerate(req.include or ()) if value != LOGPROBS]
    return found


def _chat(
    req: v1.CreateResponseRequest,
    messages: list[dict[str, Any]],
    text_format: Any,
    effort: str | None,
    logprobs: bool,
) -> GenerationRequest:
    """The chat request a response runs as."""
    try:
        tools = tool_ask(_tools(req), _tool_choice(req), req.parallel_tool_calls)
        output = output_format(_as_response_format(text_format))
    except ApiError as exc:
        raise renamed(exc) from None
    kwargs = dict(req.chat_template_kwargs or {})
    sent = {f for f in req.model_fields_set if getattr(req, f, None) is not None}
    return GenerationRequest(
        endpoint="chat",
        model_id=req.model,
        prompts=(ChatPrompt(tuple(messages), kwargs),),
        n=1,
        stream=bool(req.stream),
        include_usage=True,
        max_tokens=req.max_output_tokens or None,
        temperature=None if req.temperature is None else float(req.temperature),
        top_p=None if req.top_p is None else float(req.top_p),
        frequency_penalty=float(req.frequency_penalty or 0.0),
        presence_penalty=float(req.presence_penalty or 0.0),
        stops=(),
        seed=req.seed,
        steering=steering_ask(req),
        tools=tools,
        output=output,
        think=ThinkAsk(req.think, kwargs.get("enable_thinking"), effort),
        truncate=req.truncation == "auto",
        top_logprobs=req.top_logprobs if logprobs else None,
        logprobs=(req.top_logprobs or 0) if logprobs else None,
        sent=frozenset(sent),
    )


def _tools(req: v1.CreateResponseRequest) -> list[dict[str, Any]] | None:
    """The flat function tools as chat's `{type, function: {...}}`; any other type refused."""
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise FieldNotHonoured(
                f"tools[{i}].type",
                f"on responses: tools of type `{tool.type}` (this server calls `function` tools)",
            )
        if not tool.name:
            raise InvalidParameter(f"tools[{i}].name", "A function tool needs its `name`.")
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(req: v1.CreateResponseRequest) -> Any:
    choice = _sent(value_of(req.tool_choice))
    if not isinstance(choice, Mapping):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise FieldNotHonoured(
            "tool_choice.type",
            f"on responses: a tool_choice of type `{choice.get('type')}` (this server "
            'forces a function: `{"type": "function", "name": ...}`)',
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def _as_response_format(text_format: Any) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`."""
    if not isinstance(text_format, Mapping) or text_format.get("type") != "json_schema":
        return dict(text_format) if isinstance(text_format, Mapping) else None
    spec = {k: v for k, v in text_format.items() if k != "type"}
    return {"type": "json_schema", "json_schema": spec}


def _echo(req: v1.CreateResponseRequest, text_format: Any, effort: str | None) -> dict[str, Any]:
    """The request's members of the Response object, as OpenAI echoes them (`user` only when
    sent: the schema has no null for it)."""
    echo = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": dict(req.metadata or {}),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": effort, "summary": None},
        "store": req.store is not False,
        "temperature": req.temperature,
        "text": {"format": text_format or {"type": "text"}},
        "tool_choice": _sent(value_of(req.tool_choice)) or "auto",
        "tools": [
            {**_sent(tool), "parameters": tool.parameters, "strict": tool.strict}
            for tool in req.tools or ()
        ],
        "top_logprobs": req.top_logprobs,
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "background": False,
    }
    if req.user is not None:
        echo["user"] = req.user
    return echo


def renamed(exc: ApiError) -> ApiError:
    """`exc` naming the Responses field its chat field came from (`RENAMED`); a message's
    refusal names `input` (its chat index is not the input item's)."""
    found = None if exc.param is None else matched(exc.param, RENAMED)
    if exc.param is None or found is None:
        return exc
    chat, ours = found
    exc.message = exc.message.replace(chat, ours)
    exc.param = "input" if chat == "messages" else ours + exc.param[len(chat) :]
    return exc


def _sent(value: Any) -> Any:
    """A typed member as the JSON it was sent as (unset members left out)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, list):
        return [_sent(item) for item in value]
    return value
