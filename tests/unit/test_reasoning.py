"""Reasoning spans: the format table, the split, the streamed split, and replies with calls
(serving/chat/reasoning.py, serving/chat/replies.py)."""

from __future__ import annotations

import json
import logging
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miserver.engines.base import ChatPrompt
from miserver.engines.chatmessages import normalize_message
from miserver.engines.llamacpp.chat import ChatTemplate, render_text
from miserver.serving.chat.reasoning import FORMATS, Parts, SpanStream, Split, format_of
from miserver.serving.chat.replies import Piece, ReplyStream, whole
from miserver.serving.chat.tools import ToolPlan, tool_ask, tool_plan

TEMPLATES = Path(__file__).parent.parent / "data" / "templates"
THINK = FORMATS["think"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

# (reply, starts inside a span, reasoning, answer): replies as models write them
RECORDED = [
    (
        "<think>\nThe user asks. It is Paris.\n</think>\n\nParis.",
        False,
        "The user asks. It is Paris.",
        "Paris.",
    ),
    (
        "The user asks. It is Paris.\n</think>\n\nParis.",
        True,
        "The user asks. It is Paris.",
        "Paris.",
    ),
    ("  <think>a</think>b", False, "a", "b"),
    ("<think>\n\n</think>\n\nHello!", False, "", "Hello!"),
    (
        "<think>\nstill thinking when the budget ran out",
        False,
        "still thinking when the budget ran out",
        "",
    ),
    ("cut short inside the prompt's span", True, "cut short inside the prompt's span", ""),
    ("Paris.", False, None, "Paris."),
    ("\nParis. Not <think>ing</think> here.", False, None, "\nParis. Not <think>ing</think> here."),
    ("<thinking>is not the marker", False, None, "<thinking>is not the marker"),
    ("a\n</think>\n\nb </think> c", True, "a", "b </think> c"),
]
RECORDED_IDS = [
    "LOC-CHAT-68-opened-by-the-reply",
    "LOC-CHAT-68-opened-by-the-prompt",
    "leading-whitespace",
    "empty-span",
    "no-closing-marker",
    "no-closing-marker-inside",
    "no-span",
    "a-marker-later-is-content",
    "a-near-marker",
    "first-close-ends-the-span",
]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text("utf-8")


def streamed(text: str, inside: bool, cuts: list[int]) -> tuple[str, str]:
    """`text` pushed in pieces cut at `cuts`: the reasoning and answer sent, joined."""
    stream = SpanStream(THINK, inside)
    bounds = [0, *sorted(set(cuts)), len(text)]
    parts = [stream.push(text[a:b]) for a, b in pairwise(bounds)]
    parts.append(stream.finish())
    return "".join(p.reasoning for p in parts), "".join(p.answer for p in parts)


# -- the table -------------------------------------------------------------------------


def test_the_format_is_read_off_the_template() -> None:
    """LOC-CHAT-57: the span markers are data, picked by the template text."""
    assert format_of(template("qwen3")) is THINK
    assert format_of("{{ '[THINK]' }}") is FORMATS["mistral"]
    assert format_of(template("hermes")) is None
    assert format_of(None) is None


@pytest.mark.parametrize(
    ("prompt", "inside"),
    [
        ("<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>assistant\n", False),
        ("<think>\nold\n</think>\n\nx<|im_end|>\n<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>\nA partial answer to continue", True),
    ],
    ids=["opens", "empty-span", "no-span", "history-then-opens", "partial-inside"],
)
def test_a_prompt_that_ends_inside_a_span(prompt: str, inside: bool) -> None:
    """Qwen3-Thinking/DeepSeek-R1 templates open the span: the reply starts inside it."""
    assert THINK.opened_by(prompt) is inside


# -- the split ------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer"), RECORDED, ids=RECORDED_IDS)
def test_recorded_replies_split(
    text: str, inside: bool, reasoning: str | None, answer: str
) -> None:
    """LOC-CHAT-68: the span's text (markers and surrounding whitespace stripped) is the
    reasoning, what follows its close is the answer; a reply that opens none is all answer."""
    assert THINK.split(text, inside) == Split(reasoning, answer)


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer"), RECORDED, ids=RECORDED_IDS)
def test_every_stream_split_matches_the_whole(
    text: str, inside: bool, reasoning: str | None, answer: str
) -> None:
    """LOC-CHAT-57: cut anywhere, one character at a time included (markers split across
    tokens), the stream sends what the whole split gives, never a marker."""
    expected = (reasoning or "", answer)
    for cut in range(len(text) + 1):
        assert streamed(text, inside, [cut]) == expected, cut
    assert streamed(text, inside, list(range(len(text)))) == expected


def test_a_partial_marker_is_held_then_released() -> None:
    """Text that may begin a marker is held; it is released once it cannot."""
    stream = SpanStream(THINK, inside=False)
    assert stream.push("<th") == Parts()  # held: it may open a span
    assert stream.push("ink>Let me") == Parts(reasoning="Let me")
    assert stream.push(" see </thi") == Parts(reasoning=" see")  # the end may close the span
    assert stream.push("nk>") == Parts()
    assert stream.push("\n\nIt") == Parts(answer="It")
    assert stream.push(" is.") == Parts(answer=" is.")
    plain = SpanStream(THINK, inside=False)
    assert plain.push("<") == Parts()
    assert plain.push("b>bold</b>") == Parts(answer="<b>bold</b>")


@given(
    st.lists(st.sampled_from(["<think>", "</think>", "<th", "</", "nk>", " ", "\n", "a", "b"])),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=60)),
)
def test_streamed_equals_whole_for_any_text(
    pieces: list[str], inside: bool, cuts: list[int]
) -> None:
    """LOC-CHAT-57: already-sent text never needs reclassifying: for any reply and any
    token boundaries, the stream's parts are the whole reply's split."""
    text = "".join(pieces)
    split = THINK.split(text, inside)
    assert streamed(text, inside, [c for c in cuts if c <= len(text)]) == (
        split.reasoning or "",
        split.answer,
    )


# -- replies: reasoning, answer, calls ----------------------------------------------------


def hermes_plan() -> ToolPlan:
    """`tools: auto` against the Qwen3-style template: Hermes calls."""
    plan = tool_plan(tool_ask([WEATHER]), template("qwen3"))
    assert plan is not None
    return plan


def test_a_span_before_a_call_is_reasoning() -> None:
    """LOC-CHAT-68, LOC-CHAT-69, LOC-CHAT-38: the span is reasoning, the call is parsed from
    the answer, nothing is content."""
    text = f"I should call get_weather.\n</think>\n\n{CALL}"
    answer = whole(text, THINK.split(text, True), hermes_plan())
    assert answer.reasoning == "I should call get_weather."
    assert answer.content is None
    assert answer.calls is not None
    [call] = answer.calls
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_streamed_span_before_a_call() -> None:
    """LOC-CHAT-57, LOC-CHAT-60: reasoning deltas, then the call whole; no content."""
    text = f"<think>I should call.</think>\n{CALL}"
    reply = ReplyStream(SpanStream(THINK, False), hermes_plan())
    pieces = [reply.push(text[i : i + 3]) for i in range(0, len(text), 3)]
    last, calls = reply.finish()
    pieces.append(last)
    assert "".join(p.reasoning for p in pieces) == "I should call."
    assert "".join(p.content for p in pieces) == ""
    assert calls is not None and calls[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("text", "inside"),
    [("<think></think>", False), ("\n", True), ("<think>\n\n</think>\n\n", False)],
    ids=["LOC-CHAT-41-empty-span", "LOC-CHAT-41-blank-inside", "LOC-CHAT-41-blank-both"],
)
def test_nothing_found_is_raw_content(
    text: str, inside: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """LOC-CHAT-41: no answer, reasoning or call: the raw text is content, with a warning,
    streamed or not."""
    with caplog.at_level(logging.WARNING, "miserver.serving.chat.replies"):
        answer = whole(text, THINK.split(text, inside), None)
    assert (answer.content, answer.reasoning, answer.calls) == (text, None, None)
    assert "returned raw as content" in caplog.text
    reply = ReplyStream(SpanStream(THINK, inside), None)
    pieces = [reply.push(c) for c in text]
    last, calls = reply.finish()
    assert not any(pieces) and calls is None
    assert last == Piece(content=text)


def test_without_a_span_format_the_reply_is_content() -> None:
    """A model whose template names no span: nothing is split, nothing is held."""
    assert whole("<think>x</think>y", None, None).content == "<think>x</think>y"
    reply = ReplyStream(None, None)
    assert reply.push("<think>").content == "<think>"
    assert reply.finish() == (Piece(), None)


# -- the history's reasoning reaches the template (LOC-CHAT-10) ----------------------------


def test_history_reasoning_reaches_the_template() -> None:
    """LOC-CHAT-10: an assistant message's reasoning_content is handed to the template under
    every name templates read; the GGUF renderer (the same preparation) writes it."""
    message = {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."}
    normalized = normalize_message(message)
    assert normalized["thinking"] == normalized["reasoning"] == "It is Paris."
    chat = ChatTemplate(template("qwen3"), {}, None)
    messages = (
        {"role": "user", "content": "Capital?"},
        message,
        {"role": "user", "content": "And?"},
    )
    text = render_text(chat, ChatPrompt(messages, {"enable_thinking": False}))
    assert "<|im_start|>assistant\n<think>\nIt is Paris.\n</think>\n\nParis.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_developer_is_rendered_as_system() -> None:
    """LOC-CHAT-03: `developer` reaches the template as `system`."""
    assert normalize_message({"role": "developer", "content": "Be brief."})["role"] == "system"
    chat = ChatTemplate(template("qwen3"), {}, None)
    as_developer = (
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    as_system = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert render_text(chat, ChatPrompt(as_developer)) == render_text(chat, ChatPrompt(as_system))
