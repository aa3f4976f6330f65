"""A conversation shortened turn by turn for `truncation: "auto"` (serving/chat/truncation.py,
issue 44 item 1), without a model."""

from __future__ import annotations

from typing import Any

from miserver.engines.base import ChatPrompt
from miserver.serving.chat.truncation import without_oldest_turn


def _roles(prompt: ChatPrompt | None) -> list[str]:
    assert prompt is not None
    return [m["role"] for m in prompt.messages]


def test_the_oldest_turn_goes_whole_and_the_system_message_stays() -> None:
    """A turn runs from a user message to the next: its call and the call's result go with
    it, so what is left opens on a user message."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Rain."},
        {"role": "user", "content": "Thanks."},
    ]
    prompt = ChatPrompt(messages, {"enable_thinking": False})
    once = without_oldest_turn(prompt)
    assert _roles(once) == ["system", "user", "assistant", "user"]
    assert once is not None and once.messages[1]["content"] == "And tomorrow?"
    assert once.template_kwargs == {"enable_thinking": False}
    twice = without_oldest_turn(once)
    assert _roles(twice) == ["system", "user"]
    assert twice is not None and twice.messages[1]["content"] == "Thanks."
    assert without_oldest_turn(twice) is None


def test_a_lone_turn_cannot_be_shortened() -> None:
    """The last user turn (and what follows it, a call's result) is never dropped."""
    messages = [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "c1"},
    ]
    assert without_oldest_turn(ChatPrompt(messages)) is None
    assert without_oldest_turn(ChatPrompt([])) is None
