"""An Anthropic Messages request as the chat request it runs as (serving/messages, issue 45),
without a model: the conversation, the fields' mapping, the names refusals use."""

from __future__ import annotations

from typing import Any

import pytest

from miserver.engines.base import ChatPrompt
from miserver.errors import ApiError
from miserver.generated import v1
from miserver.serving.messages.request import message_ask, stop_reason
from miserver.serving.messages.shapes import Events, Message, usage


def ask(**body: Any) -> Any:
    full = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    return message_ask(v1.CreateMessageRequest.model_validate({**full, **body}))


def messages(made: Any) -> list[dict[str, Any]]:
    prompt = made.chat.prompts[0]
    assert isinstance(prompt, ChatPrompt)
    return list(prompt.messages)


def test_blocks_render_as_the_chat_messages_a_template_takes() -> None:
    """System blocks join; a tool_use is the assistant's call (input as an object), its
    thinking the reasoning; tool_result blocks come first as tool messages (an error
    marked), then the user's text; consecutive user messages merge."""
    made = ask(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "P"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {"type": "text", "text": "And?"},
                ],
            },
            {"role": "user", "content": "Thanks."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_2", "name": "w", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "down"}],
                        "is_error": True,
                    }
                ],
            },
        ],
    )
    assert messages(made) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "w", "arguments": {"city": "P"}},
                }
            ],
        },
        {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And?\n\nThanks."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": {}}}
            ],
        },
        {"role": "tool", "content": "Error: down", "tool_call_id": "toolu_2"},
    ]


def test_fields_map_onto_the_chat_request() -> None:
    """`stop_sequences`, `top_k`, tools with `input_schema`, `tool_choice` any as required
    with parallel calls off, `output_config.format` as a json_schema, `thinking` as think."""
    made = ask(
        stop_sequences=["END", ""],
        top_k=5,
        temperature=0.5,
        tools=[{"name": "w", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
        stream=True,
    )
    chat = made.chat
    assert chat.stops == ("END",) and chat.top_k == 5 and chat.temperature == 0.5
    assert chat.tools is not None and chat.tools.choice == "required" and chat.tools.limit == 1
    assert chat.tools.tools[0]["function"]["parameters"] == {"type": "object"}
    assert chat.think.think is True and chat.stream and chat.continuous_usage
    assert made.unused == () and chat.thinking_budget == 2048
    off = ask(thinking={"type": "disabled", "budget_tokens": 2048})
    assert off.unused == ("thinking.budget_tokens",) and off.chat.thinking_budget is None
    shaped = ask(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert shaped.chat.output is not None and shaped.chat.output.kind == "json_schema"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "s"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "tool"}, "tools": [{"name": "w"}]}, "tool_choice.name"),
        ({"tool_choice": {"type": "tool", "name": "x"}, "tools": [{"name": "w"}]}, "tool_choice"),
        (
            {"output_config": {"format": {"type": "json_schema"}}},
            "output_config.format.schema",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
    ],
)
def test_refusals_name_the_messages_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        ask(**body)
    assert refused.value.param == param


def test_a_chat_refusal_is_renamed_to_where_the_message_came_from() -> None:
    """A refusal naming the chat's `messages[3]` names the Messages message it came from."""
    made = ask(
        system="S",
        messages=[
            {"role": "user", "content": "A"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    )
    exc = made.renamed(
        ApiError("invalid_parameter", "messages[3].content is bad", "messages[3].content")
    )
    assert exc.param == "messages[2].content[0].content"


def test_stop_reasons_and_usage_in_anthropics_names() -> None:
    assert [stop_reason(f, s) for f, s in [("stop", None), ("stop", "X"), ("length", None)]] == [
        "end_turn",
        "stop_sequence",
        "max_tokens",
    ]
    assert stop_reason("tool_calls", None) == "tool_use" and stop_reason(None, None) is None
    chat = {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert usage(chat) == {
        "input_tokens": 6,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
    }


def test_a_chat_stream_as_anthropics_events() -> None:
    """Thinking, then text, then a call: one block each, in order; the trailer's usage and
    steering end it with message_delta and message_stop."""
    events = Events(Message(id="msg_1", model="m"))
    chunks: list[dict[str, Any]] = [
        {"choices": [{"delta": {"role": "assistant"}}], "usage": {"prompt_tokens": 5}},
        {"choices": [{"delta": {"reasoning_content": "Hm."}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"content": "!"}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "function": {"name": "w", "arguments": '{"a": 1}'},
                            }
                        ]
                    }
                }
            ]
        },
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7},
            "millm_steering": "none",
        },
    ]
    made = [event for chunk in chunks for event in events.chunk(chunk)]
    kinds = [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in made]
    assert kinds == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert made[0]["message"]["usage"]["input_tokens"] == 5
    assert made[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert made[-2]["usage"]["output_tokens"] == 7 and made[-2]["millm_steering"] == "none"
