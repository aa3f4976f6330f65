"""The Responses API's conversation (serving/responses/items.py), its paging
(serving/paging.py) and its stream's events (shapes.py), without a model (issue 44)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miserver.errors import ApiError
from miserver.serving import paging
from miserver.serving.responses import items, shapes
from miserver.serving.results import Encoded
from tests.openai_reference import violations


def test_text_input_is_one_user_message_with_an_id() -> None:
    (item,) = items.items("Hi.")
    assert item["id"].startswith("msg_") and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hi."}]
    assert (
        violations(
            "responses:ResponseItemList", paging.page([item], limit=20, order="desc", after=None)
        )
        == []
    )


def test_items_render_as_the_chat_messages_a_template_takes() -> None:
    """Instructions first; a reasoning item's text on the next assistant message; calls of
    one turn on one assistant message; their outputs as tool messages."""
    given = items.items(
        [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Hm."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "w",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "Rain"}],
            },
            {"role": "assistant", "content": "Sunny and rain."},
        ]
    )
    messages = items.messages(given, "Be brief.")
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    calls = messages[2]["tool_calls"]
    assert messages[2]["reasoning_content"] == "Hm." and messages[2]["content"] is None
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, "not json"]
    assert messages[4] == {"role": "tool", "content": "Rain", "tool_call_id": "c2"}
    assert given[-1]["content"][0]["type"] == "output_text"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0].type",
        ),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"type": "function_call", "name": "w", "arguments": "{}"}], "input[0].call_id"),
        ([{"role": "robot", "content": "Hi"}], "input[0].role"),
    ],
)
def test_what_is_not_served_is_refused_naming_it(raw: Any, param: str) -> None:
    with pytest.raises(ApiError) as refused:
        items.items(raw)
    assert refused.value.param == param


def test_pages_are_openais() -> None:
    listed = [{"id": f"i{k}"} for k in range(5)]
    first = paging.page(listed, limit=2, order="asc", after=None)
    assert [i["id"] for i in first["data"]] == ["i0", "i1"] and first["has_more"] is True
    rest = paging.page(listed, limit=10, order="asc", after="i1")
    assert [i["id"] for i in rest["data"]] == ["i2", "i3", "i4"] and rest["has_more"] is False
    assert paging.page(listed, limit=1, order="desc", after=None)["first_id"] == "i4"
    with pytest.raises(ApiError) as refused:
        paging.page(listed, limit=1, order="desc", after="nope")
    assert refused.value.param == "after"


ECHO = {  # the request's members a Response echoes (request.py `_echo`)
    "instructions": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": None,
    "top_p": None,
    "tools": [],
    "tool_choice": "auto",
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def test_a_chat_stream_becomes_numbered_typed_events_in_openais_shapes() -> None:
    """Reasoning, then text (a fast-path `Encoded` chunk too), then a call, then the trailer:
    each item opened and closed in order, every event valid, the last `response.completed`."""
    response = shapes.Response(id="resp_x", model="m", echo=ECHO)
    events = shapes.Events(response, lambda text: len(text.split()))
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "w", "arguments": "{}"},
    }
    chunks: list[Any] = [
        _chunk({"role": "assistant"}),
        _chunk({"reasoning_content": "Let me see."}),
        _chunk({"content": "It is "}),
        Encoded(json.dumps(_chunk({"content": "sunny."}))),
        _chunk({"tool_calls": [call]}),
        _chunk({}, "tool_calls"),
        {
            "choices": [],
            "millm_steering": "none",
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        },
    ]
    out = [*events.started(), *(e for c in chunks for e in events.chunk(c))]
    for event in out:
        assert violations("responses:ResponseStreamEvent", event) == [], event["type"]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    kinds = [e["type"] for e in out]
    assert kinds[-1] == "response.completed"
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    )
    final = out[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "It is sunny."
    assert final["usage"]["output_tokens"] == 7 and final["millm_steering"] == "none"
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3  # "Let me see."
