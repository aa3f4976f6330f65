"""A chat reply read back: its reasoning span, its answer, its tool calls.

The reasoning span is split off first (reasoning.py), so a span before a
call is reasoning, never content; the calls are then parsed from the answer
alone (tools.py), or a generic document's content read out of it. A reply
in which the parsers find no answer, reasoning or call is returned raw as
content, with a warning, rather than as an empty message (LOC-CHAT-41).
`ReplyStream` does the same for a stream, sending reasoning and answer text
as soon as no later text can change them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .reasoning import SpanStream, Split
from .tools import ToolPlan, wire_calls

log = logging.getLogger(__name__)

Calls = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole reply's parts: content None on a turn that only calls tools."""

    content: str | None
    reasoning: str | None = None
    calls: Calls | None = None


def _raw_instead(text: str) -> str:
    log.warning(
        "no answer, reasoning or call found in a reply of %d characters: returned raw as content",
        len(text),
    )
    return text


def whole(text: str, split: Split | None, tools: ToolPlan | None) -> Answer:
    """A whole reply's parts; `split` is its reasoning split (None: the model has no span)."""
    answer = text if split is None else split.answer
    parsed = None if tools is None else tools.parse(answer)
    reasoning = None if split is None else split.reasoning or None
    if parsed is not None:  # calls, or a generic document's content
        return Answer(parsed.content, reasoning, wire_calls(parsed.calls) or None)
    if split is not None and not reasoning and not answer and text:
        return Answer(_raw_instead(text))
    return Answer(answer, reasoning)


@dataclass(frozen=True, slots=True)
class Piece:
    """Text to send now in one delta: reasoning, content, or both."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ReplyStream:
    """A streamed reply: reasoning and content sent as they are known, calls held whole."""

    def __init__(self, spans: SpanStream | None, tools: ToolPlan | None) -> None:
        self._spans = spans
        self._tools = tools
        self._calls = None if tools is None else tools.buffer()
        self._raw = ""
        self._sent = False

    def push(self, text: str) -> Piece:
        """What of the reply so far can be sent now."""
        self._raw += text
        if self._spans is None:
            return self._piece("", text)
        parts = self._spans.push(text)
        return self._piece(parts.reasoning, parts.answer)

    def _piece(self, reasoning: str, answer: str) -> Piece:
        content = answer if self._calls is None else self._calls.push(answer)
        piece = Piece(reasoning, content)
        self._sent = self._sent or bool(piece)
        return piece

    def finish(self) -> tuple[Piece, Calls | None]:
        """Once the reply has ended: the text still held, and the calls (None: none)."""
        parts = None if self._spans is None else self._spans.finish()
        piece = Piece() if parts is None else self._piece(parts.reasoning, parts.answer)
        calls = None
        if self._tools is not None and self._calls is not None:
            parsed = self._tools.parse(self._calls.text)
            if parsed is not None and parsed.calls:
                calls = wire_calls(parsed.calls)
            else:  # what is held is content: raw, or a generic document's text
                piece = Piece(piece.reasoning, piece.content + self._calls.rest())
                self._sent = self._sent or bool(piece)
        if self._spans is not None and not self._sent and calls is None and self._raw:
            piece = Piece(content=_raw_instead(self._raw))
        return piece, calls
