"""Reasoning content through the official `openai` SDK, unchanged, against `miserver serve`.

The server serves SmolLM2 under the Qwen3-style test template (tests/models.py,
as tests/integration/test_reasoning.py serves it): with thinking on the
generation prompt opens a `<think>` span, and the few-shot history of
tests/chats.py makes the greedy model close it and answer. The SDK has no
`reasoning_content` field: it keeps unknown fields, readable as attributes and
in `model_extra`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.chats import capitals
from tests.e2e.conftest import checked_sdk, live_server
from tests.models import QWEN3, link_qwen3
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory, openai_check: Check) -> Iterator[OpenAI]:
    """The SDK against a server whose launch model is SmolLM2 with the Qwen3-style template."""
    models = link_qwen3(tmp_path_factory.mktemp("e2e-reasoning-models"))
    env = {"MISERVER_MODELS_DIR": str(models)}
    with (
        live_server(Path(tmp_path_factory.mktemp("e2e-reasoning")), env, model=QWEN3) as server,
        checked_sdk(server.base_url, openai_check) as sdk,
    ):
        yield sdk


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": QWEN3, "messages": capitals(), "max_tokens": 60, "temperature": 0, **extra}


def test_sdk_reads_reasoning_content(sdk: OpenAI) -> None:
    """LOC-CHAT-68, LOC-CHAT-29, LOC-CHAT-31: `reasoning_effort` (an SDK argument) turns
    thinking on; `message.reasoning_content` is readable, the answer alone in `content`."""
    reply = sdk.chat.completions.create(**ask(), reasoning_effort="low")
    message = reply.choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    assert isinstance(reasoning, str) and reasoning
    assert message.model_extra is not None
    assert message.model_extra["reasoning_content"] == reasoning
    assert message.content and "</think>" not in message.content
    with_think = sdk.chat.completions.create(**ask(), extra_body={"think": True})
    assert with_think.choices[0].message.model_extra == message.model_extra
    off = sdk.chat.completions.create(**ask(max_tokens=12), extra_body={"think": False})
    assert getattr(off.choices[0].message, "reasoning_content", "absent") is None


def test_sdk_accumulates_streamed_reasoning(sdk: OpenAI) -> None:
    """LOC-CHAT-57: `delta.reasoning_content` chunks, then `delta.content` chunks; joined,
    the non-streamed message."""
    whole = sdk.chat.completions.create(**ask(), extra_body={"think": True}).choices[0].message
    reasoning, content = "", ""
    for chunk in sdk.chat.completions.create(**ask(), extra_body={"think": True}, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            assert not content, "reasoning after the answer began"
            reasoning += piece
        content += delta.content or ""
    assert reasoning == getattr(whole, "reasoning_content", None)
    assert content == whole.content


def as_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses API input: an assistant's reasoning as a `reasoning` item
    before its message."""
    out: list[dict[str, Any]] = []
    for message in messages:
        reasoning = message.get("reasoning_content")
        if reasoning:
            text = [{"type": "reasoning_text", "text": reasoning}]
            out.append({"type": "reasoning", "summary": [], "content": text})
        out.append({"role": message["role"], "content": message["content"]})
    return out


def test_a_response_reports_reasoning_as_its_own_item(sdk: OpenAI) -> None:
    """Issue 44 items 1-3: `reasoning.effort` turns thinking on for a response; the span comes
    back as a `reasoning` item (its text as `reasoning_text`), streamed as
    `response.reasoning_text.delta` events, the answer alone in the message: what chat
    answers as `reasoning_content` and `content` for the same conversation (reasoning items of
    the history reach the template as the turns' `reasoning_content`)."""
    chat = sdk.chat.completions.create(**ask(), reasoning_effort="low").choices[0].message
    asked: dict[str, Any] = {
        "model": QWEN3,
        "input": as_items(capitals()),
        "max_output_tokens": 60,
        "temperature": 0,
        "reasoning": {"effort": "low"},
    }
    response = sdk.responses.create(**asked)
    assert response.usage is not None
    spent = response.usage.output_tokens_details.reasoning_tokens
    assert 0 < spent < response.usage.output_tokens
    (reasoning,) = [item for item in response.output if item.type == "reasoning"]
    assert reasoning.content is not None
    assert reasoning.content[0].text == getattr(chat, "reasoning_content", None)
    assert response.output_text == chat.content
    events = list(sdk.responses.create(**asked, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == reasoning.content[0].text
    final: Any = events[-1]
    assert final.response.output_text == response.output_text
    assert final.response.usage.output_tokens_details.reasoning_tokens == spent
