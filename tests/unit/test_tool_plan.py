"""The tool ask, the plan against a template, and the stream's hold-back (serving/chat/tools.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miserver.engines.base import ChatPrompt
from miserver.errors import ApiError
from miserver.serving.chat.call_formats import FORMATS
from miserver.serving.chat.tools import CallBuffer, format_header, tool_ask, tool_plan

TEMPLATES = Path(__file__).parent.parent / "data" / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
ODD = {
    "type": "function",
    "function": {"name": "odd", "parameters": {"type": "object", "not": {"required": ["x"]}}},
}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text("utf-8")


def test_no_tools_is_no_ask() -> None:
    """OAI-TOOLS-12: without tools nothing changes; `none` alone is the no-change value."""
    assert tool_ask(None) is None
    assert tool_ask([], "none") is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": ""}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
    ],
    ids=["choice-without-tools", "named-without-tools", "OAI-TOOLS-16", "duplicate-names"],
)
def test_refusals_before_any_load(body: dict[str, Any], param: str) -> None:
    """OAI-TOOLS-16: a forced function must be in `tools`; 400 invalid_parameter naming it."""
    with pytest.raises(ApiError) as info:
        tool_ask(**body)
    assert (info.value.code, info.value.param) == ("invalid_parameter", param)


def test_ask_defaults_and_limit() -> None:
    """OAI-TOOLS-12, OAI-TOOLS-17: `auto` by default; parallel_tool_calls false is one call."""
    ask = tool_ask([WEATHER, TIME])
    assert ask is not None and (ask.choice, ask.name, ask.limit) == ("auto", None, None)
    one = tool_ask([WEATHER], parallel_tool_calls=False)
    assert one is not None and one.limit == 1
    named = tool_ask([WEATHER], {"function": {"name": "get_weather"}})
    assert named is not None and (named.choice, named.name, named.limit) == (
        "function",
        "get_weather",
        1,
    )


def test_arguments_hold_only_declared_keys() -> None:
    """OAI-TOOLS-15 (issue 15 item 6): an object that lists `properties` and says nothing of
    others is closed at every depth, as llama.cpp's grammars read a schema; one that allows
    others keeps them; a function with no properties takes `{}` only."""
    nested = {
        "type": "object",
        "properties": {
            "where": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": True},
        },
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    params = tool_ask([tool]).parameters["f"]  # type: ignore[union-attr]
    assert params["additionalProperties"] is False
    assert params["properties"]["where"]["additionalProperties"] is False
    assert params["properties"]["tags"]["items"]["additionalProperties"] is False
    assert params["properties"]["extra"]["additionalProperties"] is True


def test_keywords_outside_the_subset_are_dropped_not_the_schema() -> None:
    """OAI-TOOLS-15 (issue 15 item 6): a tool's schema is enforced less the keywords the
    grammar subset lacks (LangChain writes `exclusiveMinimum`), so `input` stays an integer;
    an object bounded by `patternProperties` admits other members once that keyword goes."""
    bounded = {"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": 1000}
    parameters = {
        "type": "object",
        "properties": {
            "input": bounded,
            "labels": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        },
        "required": ["input"],
    }
    tool = {"type": "function", "function": {"name": "magic", "parameters": parameters}}
    params = tool_ask([tool]).parameters["magic"]  # type: ignore[union-attr]
    assert params["properties"]["input"] == {"type": "integer"}
    assert params["properties"]["labels"] == {"type": "object", "additionalProperties": True}
    assert (params["required"], params["additionalProperties"]) == (["input"], False)


def test_a_named_choice_is_one_call_in_the_generic_schema() -> None:
    """OAI-TOOLS-15 (issue 15 item 6): a named tool_choice asks for that function's call once,
    so the generic document holds at most one call, even with parallel calls allowed."""
    body = {"tools": [WEATHER, TIME], "tool_choice": {"function": {"name": "get_weather"}}}
    plan = tool_plan(tool_ask(**body), None)
    assert plan is not None and plan.constraint is not None
    calls = json.loads(plan.constraint.text)["properties"]["tool_calls"]
    assert (calls["minItems"], calls["maxItems"]) == (1, 1)


def test_parameters_outside_the_subset_are_enforced_as_any_object() -> None:
    """OAI-TOOLS-15: a forced call's grammar uses the function's schema when the server can
    enforce it, else any JSON object (a tool definition is never refused for its schema)."""
    ask = tool_ask([WEATHER, TIME, ODD])
    assert ask is not None
    assert ask.parameters == {
        "get_weather": {**WEATHER["function"]["parameters"], "additionalProperties": False},  # type: ignore[dict-item]
        "get_time": {"type": "object"},
        "odd": {"type": "object"},
    }


def test_templates_that_take_no_tools_get_the_generic_format() -> None:
    """OAI-TOOLS-23 (superseded by the generic format): a template that takes no tools, or
    none at all, is served in the generic format: no opening, the reply one JSON document."""
    ask = tool_ask([WEATHER])
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    for text in (None, plain):
        plan = tool_plan(ask, text)
        assert plan is not None and plan.format.name == "generic" and plan.opening == ""
        assert plan.constraint is not None and plan.constraint.kind == "json_schema"


def test_templates_with_unknown_formats_are_refused() -> None:
    """OAI-TOOLS-24: a template that takes tools in a format none reads: field_not_honoured."""
    gemma = "{% if tools %}<start_function_declaration>{{ tools }}{% endif %}"
    with pytest.raises(ApiError) as info:
        tool_plan(tool_ask([WEATHER]), gemma)
    assert (info.value.code, info.value.param) == ("field_not_honoured", "tools")


@pytest.mark.parametrize("family", ["hermes", "lfm2", "llama3", "generic"])
def test_the_format_is_stated_in_a_header(family: str) -> None:
    """OAI-TOOLS-11, -30: X-miLLM-Tool-Format names the format the tools were shown in; none
    without a plan."""
    text = None if family == "generic" else template(family)
    plan = tool_plan(tool_ask([WEATHER]), text)
    assert format_header(plan) == {"X-miLLM-Tool-Format": family}
    assert format_header(None) == {}


def test_none_is_a_plain_chat() -> None:
    """OAI-TOOLS-13: `none` does not show the tools (even to a template that takes none)."""
    assert tool_plan(tool_ask([WEATHER], "none"), None) is None


@pytest.mark.parametrize("family", ["hermes", "lfm2", "llama3"])
def test_auto_shows_the_tools_and_opens_nothing(family: str) -> None:
    """OAI-TOOLS-02, OAI-TOOLS-11, OAI-TOOLS-12: the template's format, no opening."""
    plan = tool_plan(tool_ask([WEATHER]), template(family))
    assert plan is not None and plan.format.name == family
    assert (plan.opening, plan.constraint) == ("", None)
    prompt = plan.prompt(ChatPrompt(({"role": "user", "content": "hi"},)))
    assert prompt.tools == (WEATHER,) and prompt.opening == ""


@pytest.mark.parametrize(
    ("family", "head", "tail"),
    [
        ("hermes", 'get_weather", "arguments": ', "}\n</tool_call>"),
        ("llama3", 'get_weather", "parameters": ', "}"),
    ],
)
def test_forced_calls_are_constrained_where_arguments_are_json(
    family: str, head: str, tail: str
) -> None:
    """OAI-TOOLS-14, OAI-TOOLS-15: the opening ends the prompt; what follows it is one
    offered function's name (required) and arguments valid under its schema."""
    required = tool_plan(tool_ask([WEATHER], "required"), template(family))
    assert required is not None and required.constraint is not None
    assert required.constraint.kind == "call"
    payload = json.loads(required.constraint.text)
    closed = {**WEATHER["function"]["parameters"], "additionalProperties": False}  # type: ignore[dict-item]
    assert payload == {"options": [[head, closed]], "tail": tail}
    forced = {"function": {"name": "get_weather"}}
    named = tool_plan(tool_ask([WEATHER], forced), template(family))
    assert named is not None and named.constraint is not None
    assert json.loads(named.constraint.text)["options"] == [["", closed]]
    assert named.opening.endswith(": ") and "get_weather" in named.opening


def test_lfm2_forced_calls_are_opened_not_constrained() -> None:
    """OAI-TOOLS-14: LFM2 writes Python-style arguments, so only the opening forces the call."""
    plan = tool_plan(tool_ask([WEATHER], "required"), template("lfm2"))
    assert plan is not None and plan.opening == "<|tool_call_start|>[" and plan.constraint is None


def pushed(buffer: CallBuffer, parts: list[str]) -> str:
    return "".join(buffer.push(p) for p in parts)


def test_stream_sends_text_before_a_call_and_holds_the_call() -> None:
    """OAI-TOOLS-05, OAI-TOOLS-06: content deltas stop at the call marker, even split."""
    buffer = CallBuffer(FORMATS["hermes"], forced=False)
    sent = pushed(
        buffer, ["Let me check. <tool", '_call>\n{"name": "get_weather"', "}</tool_call>"]
    )
    assert sent == "Let me check. "
    assert buffer.text.startswith("Let me check. <tool_call>")
    assert buffer.rest().startswith("<tool_call>")


def test_stream_releases_a_false_start() -> None:
    """OAI-TOOLS-05, OAI-TOOLS-21: `<tool` that never becomes a marker is content."""
    buffer = CallBuffer(FORMATS["hermes"], forced=False)
    assert pushed(buffer, ["a <to", "ol belt"]) == "a <tool belt"


def test_whole_reply_format_holds_a_reply_that_begins_like_a_call() -> None:
    """OAI-TOOLS-10: a Llama 3 call is the whole reply: one starting with `{` is held."""
    held = CallBuffer(FORMATS["llama3"], forced=False)
    assert pushed(held, [" ", '{"name"', ": 1}"]) == ""
    free = CallBuffer(FORMATS["llama3"], forced=False)
    assert pushed(free, ["Sure, ", '{"name": 1}']) == 'Sure, {"name": 1}'


def test_forced_call_holds_everything() -> None:
    """OAI-TOOLS-32: after a forced opening every token belongs to the call."""
    buffer = CallBuffer(FORMATS["lfm2"], forced=True)
    assert pushed(buffer, ["city='Paris')]", "<|tool_call_end|>"]) == ""
