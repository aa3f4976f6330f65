"""Anthropic's Messages API (`/v1/messages`, issue 45, contract 0.22.0) through the official
`anthropic` SDK, on the default server (SmolLM2's GGUF on llama.cpp).

Every body and stream event the SDK receives is validated against Anthropic's own types
and the contract's schema of it (tests/anthropic_reference.py). The errors' shapes and the
security model on these routes are in tests/integration/test_messages_conventions.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pydantic
import pytest

from tests.anthropic_reference import AnthropicCheck, client
from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer

pytestmark = pytest.mark.e2e

QUESTION: Any = [{"role": "user", "content": "Name three colours of the rainbow."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
FORCED: Any = {"type": "tool", "name": "get_weather"}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # in the body, as older clients send it: SDK 2.17 sends none


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def check() -> AnthropicCheck:
    return AnthropicCheck()


@pytest.fixture(scope="module")
def sdk(default_server: LiveServer, check: AnthropicCheck) -> Iterator[anthropic.Anthropic]:
    base = default_server.base_url.removesuffix("/v1")
    with anthropic.Anthropic(
        base_url=base, api_key="not-needed", max_retries=0, http_client=client(check)
    ) as made:
        yield made


def test_a_message_in_anthropics_shape(sdk: anthropic.Anthropic) -> None:
    """Issue 45 items 1-2: `messages.create` answers a Message: a `msg_` id, a text block, the
    stop reason, the usage in Anthropic's names (input + cache read = the prompt), the
    system prompt honoured; X-miLLM-Steering and a `request-id`."""
    raw = sdk.messages.with_raw_response.create(
        model=GGUF_ID,
        max_tokens=24,
        system="Answer briefly.",
        messages=QUESTION,
        extra_body=GREEDY,
    )
    message = raw.parse()
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == GGUF_ID
    (block,) = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 24
    assert message.usage.cache_creation_input_tokens == 0
    assert raw.headers["X-miLLM-Steering"] == "none"
    assert raw.headers["request-id"] == raw.headers["x-request-id"]
    assert (message.model_extra or {})["millm_steering"] == "none"


def test_the_stream_helper_gives_the_final_message(
    sdk: anthropic.Anthropic, check: AnthropicCheck
) -> None:
    """Issue 45 item 3: `messages.stream()` reads Anthropic's events (message_start, ping, a
    text block's start, deltas and stop, message_delta, message_stop) into the final
    Message, the same text a JSON reply gives."""
    asked: dict[str, Any] = {"model": GGUF_ID, "max_tokens": 24, "messages": QUESTION}
    with sdk.messages.stream(**asked, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    kinds = [event["type"] for event in check.streams[-1]]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].type == "text" and final.content[0].text == text
    plain = sdk.messages.create(**asked, extra_body=GREEDY)
    assert plain.content[0].type == "text" and plain.content[0].text == text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    prompt = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == prompt


def test_a_tool_use_round_trip(sdk: anthropic.Anthropic) -> None:
    """Issue 45 acceptance: a forced tool comes back as a `tool_use` block (a `toolu_` id, its
    `input` parsed) with `stop_reason: "tool_use"`; its `tool_result` sent back continues
    the conversation to an answer, on the KV prefix the first turn left."""
    first = sdk.messages.create(
        model=GGUF_ID,
        max_tokens=64,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCED,
        extra_body=GREEDY,
    )
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use"
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert isinstance(call.input, dict) and isinstance(call.input.get("city"), str)
    result: Any = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21C"}
    second = sdk.messages.create(
        model=GGUF_ID,
        max_tokens=24,
        messages=[
            *ASK_WEATHER,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        tools=[WEATHER],
        extra_body=GREEDY,
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.content
    assert (second.usage.cache_read_input_tokens or 0) > 0


def test_a_forced_tool_streams_its_input_as_json_deltas(
    sdk: anthropic.Anthropic, check: AnthropicCheck
) -> None:
    """Issue 45 acceptance: streamed, the forced call is a `tool_use` block whose input
    comes as `input_json_delta` pieces; the SDK's final message parses it."""
    with sdk.messages.stream(
        model=GGUF_ID,
        max_tokens=64,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice=FORCED,
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    events = check.streams[-1]
    pieces = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    (call,) = [block for block in final.content if block.type == "tool_use"]
    assert pieces and json.loads("".join(pieces)) == call.input
    assert final.stop_reason == "tool_use"
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_stop_sequences_end_the_message_and_say_which(sdk: anthropic.Anthropic) -> None:
    """Issue 45 items 1-2: a stop sequence in the greedy text ends it there, with
    `stop_reason: "stop_sequence"` and the sequence; streamed, `message_delta` says so."""
    asked: dict[str, Any] = {"model": GGUF_ID, "max_tokens": 32, "messages": QUESTION}
    plain = sdk.messages.create(**asked, extra_body=GREEDY)
    text = plain.content[0].text  # type: ignore[union-attr]
    words = text.split()
    assert len(words) >= 3, text
    word = words[2]
    stopped = sdk.messages.create(**asked, extra_body=GREEDY, stop_sequences=["zzzz", word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[: text.index(word)]  # type: ignore[union-attr]
    with sdk.messages.stream(**asked, extra_body=GREEDY, stop_sequences=[word]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word


def test_output_config_format_holds_the_reply_to_a_schema(sdk: anthropic.Anthropic) -> None:
    """Issue 45 item 1: `output_config.format` (a JSON schema) is held by the grammar on the
    default model, and the SDK's `messages.parse` reads the reply into the model class."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    people: Any = [{"role": "user", "content": "Invent a person: a name and an age."}]
    raw = sdk.messages.with_raw_response.create(
        model=GGUF_ID,
        max_tokens=64,
        messages=people,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    made = raw.parse()
    jsonschema.validate(json.loads(made.content[0].text), schema)  # type: ignore[union-attr]
    assert raw.headers["X-miLLM-Constrained"].startswith("json_schema")
    parsed = sdk.messages.parse(
        model=GGUF_ID, max_tokens=64, messages=people, output_format=Person, extra_body=GREEDY
    )
    assert isinstance(parsed.parsed_output, Person)


def test_count_tokens_is_the_billed_input(sdk: anthropic.Anthropic) -> None:
    """Issue 45 item 4: `count_tokens` equals what the same request is billed as input
    (`input_tokens` + `cache_read_input_tokens`), with a system prompt and tools shown."""
    asked: dict[str, Any] = {
        "model": GGUF_ID,
        "system": "You check the weather.",
        "messages": ASK_WEATHER,
        "tools": [WEATHER],
    }
    counted = sdk.messages.count_tokens(**asked)
    billed = sdk.messages.create(**asked, max_tokens=4, extra_body=GREEDY)
    assert counted.input_tokens == billed.usage.input_tokens + (
        billed.usage.cache_read_input_tokens or 0
    )
    bare = sdk.messages.count_tokens(model=GGUF_ID, messages=ASK_WEATHER)
    assert 0 < bare.input_tokens < counted.input_tokens


def test_fields_that_change_nothing_are_reported(sdk: anthropic.Anthropic) -> None:
    """Issue 45 item 1, OAI-VALID-07/10 on messages: `metadata`, a thinking budget where
    thinking is off and `service_tier` are reported in X-miLLM-Ignored-Fields; strict mode
    refuses them."""
    asked: dict[str, Any] = {
        "model": GGUF_ID,
        "max_tokens": 2,
        "messages": QUESTION,
        "metadata": {"user_id": "u1"},
        "service_tier": "auto",
        "thinking": {"type": "disabled"},
    }
    raw = sdk.messages.with_raw_response.create(**asked)
    assert raw.headers["X-miLLM-Ignored-Fields"] == '"metadata", "service_tier"'
    thinking = {"type": "disabled", "budget_tokens": 1024}  # a budget for no thinking
    budget = sdk.messages.with_raw_response.create(
        **{**asked, "metadata": None, "service_tier": None, "thinking": thinking}
    )
    assert budget.headers["X-miLLM-Ignored-Fields"] == '"thinking.budget_tokens"'
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(**asked, extra_headers={"X-miLLM-Strict": "true"})
    assert refused.value.body["error"]["code"] == "unused_fields_refused"  # type: ignore[index]
