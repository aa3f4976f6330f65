"""Function calling through the official `openai` SDK, unchanged, against `miserver serve`.

The server serves SmolLM2 under the Hermes test template (the models
directory of tests/integration/test_tools.py); the few-shot history there
makes the greedy model call `get_weather` for Paris.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.conftest import cache_dir
from tests.e2e.conftest import live_server
from tests.integration.test_tools import PARIS, SOURCE, WEATHER, build_models_dir, few_shot

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-hermes"


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    """The SDK against a server whose launch model is SmolLM2 with the Hermes template."""
    if not (cache_dir() / SOURCE / "config.json").is_file():
        pytest.skip(f"the converted SmolLM2 is not in {cache_dir()} (run the model tests first)")
    models = build_models_dir(tmp_path_factory.mktemp("e2e-tool-models"))
    env = {"MISERVER_MODELS_DIR": str(models)}
    with (
        live_server(Path(tmp_path_factory.mktemp("e2e-tools")), env, model=MODEL) as server,
        OpenAI(base_url=server.base_url, api_key="not-needed", max_retries=0, timeout=60.0) as sdk,
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
