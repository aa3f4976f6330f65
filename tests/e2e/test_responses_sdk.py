"""The Responses API (`/v1/responses`, issue 44, contract 0.20.0) through the official openai SDK.

Every body and every stream event the SDK receives is checked against OpenAI's published
Responses schemas (tests/openai_reference.py). The default server (SmolLM2's GGUF on
llama.cpp) serves these cases; the steered one is in test_steering_live.py, on its
transformers server with the trained SAE attached, so both engines answer the route.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, LocalClient, cache_dir
from tests.e2e.conftest import LiveServer, checked_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

QUESTION = "Name three colours of the rainbow."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def sdk(default_server: LiveServer, openai_check: Check) -> Iterator[OpenAI]:
    with checked_sdk(default_server.base_url, openai_check) as client:
        yield client


def test_a_response_in_openais_shape(sdk: OpenAI) -> None:
    """Issue 44 items 1-2: `responses.create` answers a Response: a `resp_` id, a message
    item with `output_text` and, with `include`, each output token's log-probability and its
    alternatives; the usage in the Responses API's names; the request echoed."""
    raw = sdk.responses.with_raw_response.create(
        model=GGUF_ID,
        input=QUESTION,
        instructions="Answer briefly.",
        max_output_tokens=24,
        temperature=0,
        metadata={"case": "shape"},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    (message,) = [item for item in response.output if item.type == "message"]
    assert message.role == "assistant" and message.content[0].type == "output_text"
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "Answer briefly." and response.metadata == {"case": "shape"}
    logprobs = message.content[0].logprobs  # type: ignore[union-attr]
    assert logprobs is not None and len(logprobs) == response.usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    assert "".join(entry.token for entry in logprobs) == response.output_text
    assert raw.headers["X-miLLM-Steering"] == "none"
    assert raw.headers["X-miLLM-Model"] == GGUF_ID
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"


def test_a_stream_sends_the_typed_events_in_order(sdk: OpenAI) -> None:
    """Issue 44 item 3: `response.created` first, numbered events, text deltas that add up to
    the final Response's text, and `response.completed` (or `.incomplete`) last."""
    events = list(
        sdk.responses.create(
            model=GGUF_ID, input=QUESTION, max_output_tokens=24, temperature=0, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds[-1] in ("response.completed", "response.incomplete")
    for kind in ("response.output_item.added", "response.content_part.added"):
        assert kind in kinds
    for kind in ("response.output_text.done", "response.content_part.done"):
        assert kind in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas and final.output_text == deltas
    plain = sdk.responses.create(model=GGUF_ID, input=QUESTION, max_output_tokens=24, temperature=0)
    assert plain.output_text == deltas


def test_the_stream_helper_gives_the_final_response(sdk: OpenAI) -> None:
    """Issue 44 acceptance: the SDK's `responses.stream()` accumulates the events into the
    same Response it then retrieves."""
    with sdk.responses.stream(  # the helper wants `response.completed`: room to finish
        model=GGUF_ID, input="Say hello.", max_output_tokens=128, temperature=0
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_text == text
    assert sdk.responses.retrieve(final.id).output_text == text


def test_stored_responses_are_retrieved_listed_and_deleted(sdk: OpenAI) -> None:
    """Issue 44 item 4: `retrieve`, `input_items.list` (OpenAI's paging: newest first,
    `limit`, `after`, `has_more`) and `delete`, after which the id is unknown (404)."""
    items: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {"role": "user", "content": QUESTION},
    ]
    created = sdk.responses.create(model=GGUF_ID, input=items, max_output_tokens=8)
    assert sdk.responses.retrieve(created.id).model_dump() == created.model_dump()
    listed = sdk.responses.input_items.list(created.id)
    assert [item.role for item in listed.data] == ["user", "user", "system"]  # type: ignore[union-attr]
    first = sdk.responses.input_items.list(created.id, limit=2, order="asc")
    assert first.has_more is True and len(first.data) == 2
    rest = sdk.responses.input_items.list(created.id, order="asc", after=first.data[-1].id)
    assert [item.id for item in rest.data] == [listed.data[0].id] and rest.has_more is False
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as gone:
        sdk.responses.retrieve(created.id)
    assert gone.value.code == "response_not_found"


def test_a_function_call_round_trip_continues_the_cached_conversation(sdk: OpenAI) -> None:
    """Issue 44 acceptance: a forced function call comes back as a `function_call` item;
    its output, sent with `previous_response_id`, continues the conversation on the KV
    prefix the first turn left (`cached_tokens` > 0)."""
    first = sdk.responses.create(
        model=GGUF_ID,
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    assert isinstance(json.loads(call.arguments), dict)
    second = sdk.responses.create(
        model=GGUF_ID,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=24,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_truncation_auto_drops_the_oldest_turns_past_the_window(sdk: OpenAI) -> None:
    """Issue 44 item 1: a conversation past the model's window is refused as chat refuses
    it (`truncation: "disabled"`, the default); with `truncation: "auto"` its oldest turns
    are dropped until it fits, and the usage counts what the model saw."""
    long = "the quick brown fox jumps over the lazy dog " * 4000  # past any window here
    conversation: Any = [
        {"role": "user", "content": long},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": QUESTION},
    ]
    asked: dict[str, Any] = {
        "model": GGUF_ID,
        "input": conversation,
        "instructions": "Answer briefly.",
        "max_output_tokens": 4,
    }
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(**asked)
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "input"
    response = sdk.responses.create(**asked, truncation="auto")
    assert response.truncation == "auto" and response.status in ("completed", "incomplete")
    alone = sdk.responses.create(**{**asked, "input": QUESTION})
    assert response.usage is not None and alone.usage is not None
    assert response.usage.input_tokens == alone.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as still:  # the last turn is never dropped
        sdk.responses.create(**{**asked, "input": long}, truncation="auto")
    assert still.value.code == "context_length_exceeded"


def test_a_seed_reruns_identically_and_is_echoed(sdk: OpenAI) -> None:
    """Issue 44 item 5, OAI-SEED-04/05/08 on responses: `seed` (through `extra_body`) gives
    the same sampled text twice and is echoed in X-miLLM-Seed; a response without one has
    no such header. The Response echoes the temperature and top_p that ran: the config's
    where none was sent (1.0, as OpenAI's)."""
    asked: dict[str, Any] = {"model": GGUF_ID, "input": QUESTION, "max_output_tokens": 12}
    first = sdk.responses.with_raw_response.create(**asked, temperature=1.0, extra_body={"seed": 7})
    again = sdk.responses.create(**asked, temperature=1.0, extra_body={"seed": 7})
    assert first.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert first.parse().output_text == again.output_text
    unseeded = sdk.responses.with_raw_response.create(**asked)
    assert "X-miLLM-Seed" not in unseeded.headers
    echoed = unseeded.parse()
    assert (echoed.temperature, echoed.top_p) == (1.0, 1.0)


def test_text_format_json_schema_constrains_the_default_model(sdk: OpenAI) -> None:
    """Issue 44 acceptance: `text.format` json_schema (strict) on the default model gives a
    document its schema accepts, and `X-miLLM-Constrained` names it."""
    raw = sdk.responses.with_raw_response.create(
        model=GGUF_ID,
        input="Invent a person.",
        text={
            "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
        },
        max_output_tokens=64,
        temperature=0,
    )
    response = raw.parse()
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert raw.headers["X-miLLM-Constrained"] == 'json_schema;name="person"'
    assert response.text is not None and response.text.format.type == "json_schema"


def test_refusals_name_the_responses_field(sdk: OpenAI) -> None:
    """Issue 44 items 1 and 4: what is not served is refused naming it, before any load."""
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"background": True}, "field_not_honoured", "background"),
        ({"tools": [{"type": "web_search"}]}, "field_not_honoured", "tools[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "invalid_parameter",
            "input[0].content[0].type",
        ),
        (
            {"previous_response_id": "resp_none"},
            "previous_response_not_found",
            "previous_response_id",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "invalid_parameter",
            "text.format.schema",
        ),
    ]
    for extra, code, param in cases:
        body: dict[str, Any] = {"model": GGUF_ID, "input": QUESTION, **extra}
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(**body)
        assert (refused.value.code, refused.value.param) == (code, param), extra


def test_a_restart_keeps_stored_responses(tmp_path: Path) -> None:
    """Issue 44 item 4: stored responses live in the data dir's SQLite, across a restart (a
    second server on the same data dir, in this process); `store: false` keeps nothing."""
    settings = Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), threads=ENGINE_THREADS)
    body = {"model": GGUF_ID, "input": QUESTION, "max_output_tokens": 8}
    with LocalClient(Server(settings)) as first:
        kept = first.post("/v1/responses", json=body).json()
        gone = first.post("/v1/responses", json={**body, "store": False}).json()
    with LocalClient(Server(settings)) as again:
        assert again.get(f"/v1/responses/{kept['id']}").json() == kept
        assert again.get(f"/v1/responses/{gone['id']}").status_code == 404


def test_fields_that_change_nothing_are_reported_and_strict_mode_refuses_them(
    sdk: OpenAI,
) -> None:
    """Issue 44 item 1, OAI-VALID-07/10 on responses: `user`, `service_tier`, `text.verbosity`,
    a reasoning summary and an `include` other than logprobs are reported in
    X-miLLM-Ignored-Fields; with X-miLLM-Strict they are refused instead."""
    asked: dict[str, Any] = {
        "model": GGUF_ID,
        "input": QUESTION,
        "max_output_tokens": 2,
        "user": "u1",
        "text": {"verbosity": "low"},
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }
    raw = sdk.responses.with_raw_response.create(**asked)
    assert raw.headers["X-miLLM-Ignored-Fields"] == (
        '"user", "text.verbosity", "reasoning.summary", "include[0]"'
    )
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(**asked, extra_headers={"X-miLLM-Strict": "true"})
    assert refused.value.code == "unused_fields_refused"
