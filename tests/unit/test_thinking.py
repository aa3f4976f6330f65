"""Thinking on or off: the precedence, unused fields, constraints (serving/chat/thinking.py)."""

from __future__ import annotations

from typing import Any

import pytest

from miserver.engines.base import ChatPrompt
from miserver.errors import ApiError
from miserver.generated import v1
from miserver.serving.chat.thinking import KWARG, ThinkAsk, Thinking, settle, think_setting
from miserver.serving.completions.requests import GenerationRequest, chat_request, with_thinking
from miserver.serving.prompts import TextPrompt


def asked(body: dict[str, Any]) -> ThinkAsk:
    """The thinking fields of a chat body, as the request builder reads them."""
    messages = [{"role": "user", "content": "Hi"}]
    return chat_request(v1.ChatCompletionRequest(model="m", messages=messages, **body)).think


@pytest.mark.parametrize(
    ("think", "enable", "effort", "default", "expected"),
    [
        (True, False, "none", False, Thinking(True, "think")),
        (False, True, "high", True, Thinking(False, "think")),
        (None, True, "none", False, Thinking(True, KWARG)),
        (None, False, "high", True, Thinking(False, KWARG)),
        (None, None, "none", True, Thinking(False, "reasoning_effort")),
        (None, None, "low", False, Thinking(True, "reasoning_effort")),
        (None, None, "medium", False, Thinking(True, "reasoning_effort")),
        (None, None, "high", False, Thinking(True, "reasoning_effort")),
        (None, None, "minimal", False, Thinking(True, "reasoning_effort")),
        (None, None, None, True, Thinking(True)),
        (None, None, None, False, Thinking(False)),
    ],
    ids=[
        "LOC-CHAT-29-think-on",
        "LOC-CHAT-29-think-off",
        "LOC-CHAT-30-kwargs-on",
        "LOC-CHAT-30-kwargs-off",
        "LOC-CHAT-31-none-off",
        "REQ-003-open-17-low",
        "REQ-003-open-17-medium",
        "REQ-003-open-17-high",
        "REQ-003-open-17-minimal",
        "LOC-CHAT-32-default-on",
        "LOC-CHAT-32-default-off",
    ],
)
def test_most_specific_first(
    think: bool | None, enable: bool | None, effort: str | None, default: bool, expected: Thinking
) -> None:
    """LOC-CHAT-29..32: think, then enable_thinking, then reasoning_effort ("none" alone is
    off: open point 17), then the server's default."""
    assert think_setting(think, enable, effort, default) == expected


@pytest.mark.parametrize(
    ("body", "default", "expected"),
    [
        ({}, True, (True, [])),
        ({"think": True}, False, (True, [])),
        ({"think": False, "reasoning_effort": "high"}, True, (False, ["reasoning_effort"])),
        (
            {"think": True, "chat_template_kwargs": {"enable_thinking": False, "x": 1}},
            False,
            (True, [KWARG]),
        ),
        ({"chat_template_kwargs": {"x": 1}, "reasoning_effort": "none"}, True, (False, [])),
        ({"think": None, "reasoning_effort": None}, True, (True, [])),
    ],
    ids=["default", "think", "LOC-CHAT-29-overrides", "kwargs-overridden", "other-kwargs", "nulls"],
)
def test_fields_a_more_specific_one_overrode_are_unused(
    body: dict[str, Any], default: bool, expected: tuple[bool, list[str]]
) -> None:
    """A field that had no effect is reported (X-miLLM-Ignored-Fields)."""
    assert settle(asked(body), default, constrained=False) == expected


@pytest.mark.parametrize(
    ("body", "default", "expected"),
    [
        ({"think": True}, False, (False, ["think"])),
        ({"reasoning_effort": "high"}, False, (False, ["reasoning_effort"])),
        ({"chat_template_kwargs": {"enable_thinking": True}}, False, (False, [KWARG])),
        ({}, True, (False, [])),
        ({"think": False}, True, (False, [])),
    ],
    ids=["LOC-CHAT-40-think", "LOC-CHAT-40-effort", "LOC-CHAT-40-kwargs", "default", "off"],
)
def test_a_constrained_reply_has_thinking_off(
    body: dict[str, Any], default: bool, expected: tuple[bool, list[str]]
) -> None:
    """LOC-CHAT-40: reasoning is never constrained, so a reply held to a grammar from its
    first token is rendered thinking off; the field that asked for thinking is reported."""
    assert settle(asked(body), default, constrained=True) == expected


@pytest.mark.parametrize("value", ["yes", 1, [], {}])
def test_enable_thinking_must_be_a_boolean(value: Any) -> None:
    """LOC-CHAT-30: the switch is a boolean; anything else is 400 naming it."""
    with pytest.raises(ApiError) as info:
        settle(
            asked({"chat_template_kwargs": {"enable_thinking": value}}), False, constrained=False
        )
    assert (info.value.code, info.value.param) == ("invalid_parameter", KWARG)


def test_the_switch_joins_the_other_template_variables() -> None:
    """LOC-CHAT-29: `enable_thinking` reaches the template beside the request's other
    variables, overriding only itself; text prompts are untouched."""
    chat = ChatPrompt(({"role": "user", "content": "Hi"},), {"enable_thinking": True, "x": 1})
    req = GenerationRequest(
        endpoint="chat",
        model_id="m",
        prompts=(chat, TextPrompt("t", True)),
        n=1,
        stream=False,
        include_usage=False,
        max_tokens=None,
        temperature=1.0,
        top_p=1.0,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        stops=(),
        seed=None,
    )
    out = with_thinking(req, False)
    first, second = out.prompts
    assert isinstance(first, ChatPrompt)
    assert first.template_kwargs == {"enable_thinking": False, "x": 1}
    assert second == TextPrompt("t", True)
    assert chat.template_kwargs == {"enable_thinking": True, "x": 1}  # the request's own copy


def test_where_template_kwargs_are_dropped_enable_thinking_takes_no_part() -> None:
    """OAI-GGUF-10 with LOC-CHAT-29..32: on GGUF chat_template_kwargs is dropped (the policy
    reports it), so its enable_thinking neither decides nor is reported twice; `think`,
    `reasoning_effort` and the default still decide."""
    body = {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"}
    assert settle(asked(body), True, constrained=False, kwargs_honoured=False) == (False, [])
    assert settle(asked(body), True, constrained=False) == (True, ["reasoning_effort"])
    only_kwargs = {"chat_template_kwargs": {"enable_thinking": True}}
    assert settle(asked(only_kwargs), False, constrained=False, kwargs_honoured=False) == (
        False,
        [],
    )
    assert settle(
        asked({"think": True, **only_kwargs}), False, constrained=False, kwargs_honoured=False
    ) == (
        True,
        [],
    )
