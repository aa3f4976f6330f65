"""Function calling through the official `openai` SDK, unchanged, against `miserver serve`.

The server serves SmolLM2 under the Hermes test template (the models
directory of tests/models.py); the few-shot history of tests/chats.py makes
the greedy model call `get_weather` for Paris. The last test switches
to the default model, whose own template takes no tools (the generic format).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.chats import PARIS, WEATHER, few_shot
from tests.conftest import MODEL_ID
from tests.e2e.conftest import checked_sdk, live_server
from tests.models import build_models_dir
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-hermes"


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory, openai_check: Check) -> Iterator[OpenAI]:
    """The SDK against a server whose launch model is SmolLM2 with the Hermes template."""
    models = build_models_dir(tmp_path_factory.mktemp("e2e-tool-models"))
    env = {"MISERVER_MODELS_DIR": str(models)}
    with (
        live_server(Path(tmp_path_factory.mktemp("e2e-tools")), env, model=MODEL) as server,
        checked_sdk(server.base_url, openai_check) as sdk,
    ):
        yield sdk


def ask(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": few_shot(),
        "tools": WEATHER,
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


def test_sdk_reads_a_forced_call(sdk: OpenAI) -> None:
    """OAI-INTEG-04, OAI-TOOLS-03, OAI-TOOLS-04, OAI-TOOLS-15: `message.tool_calls` as is."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = sdk.chat.completions.create(**ask(tool_choice=named))
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.role == "assistant" and choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == PARIS


def test_sdk_accumulates_a_streamed_call(sdk: OpenAI) -> None:
    """OAI-INTEG-04, OAI-TOOLS-05..07, OAI-TOOLS-14: the usual `delta.tool_calls` loop."""
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for chunk in sdk.chat.completions.create(**ask(tool_choice="required"), stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            if part.function is not None:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
    assert finish == "tool_calls" and content == ""
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == PARIS


def test_sdk_agent_loop_on_the_default_model(sdk: OpenAI) -> None:
    """OAI-INTEG-04, OAI-TOOLS-03, -04, -12, -18, -19 (generic format): SmolLM2's own template
    takes no tools, yet the SDK gets `tool_calls` from it unchanged, sends the call and its
    result back, and gets the answer as text; each response names the format."""
    raw = sdk.chat.completions.with_raw_response.create(**ask(model=MODEL_ID))
    assert raw.headers["X-miLLM-Tool-Format"] == "generic"
    reply = raw.parse()
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == PARIS
    said = choice.message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": call.id, "content": "18 C"}
    messages = [*few_shot(), said, result]
    raw = sdk.chat.completions.with_raw_response.create(**ask(model=MODEL_ID, messages=messages))
    assert raw.headers["X-miLLM-Tool-Format"] == "generic"
    [answer] = raw.parse().choices
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    assert answer.message.content is not None and "18" in answer.message.content
    assert "{" not in answer.message.content
