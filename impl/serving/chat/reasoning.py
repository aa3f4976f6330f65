"""Reasoning spans in chat replies (LOC-CHAT-10): formats and splitting.

The formats are data (spec/policy/reasoning_formats.yaml): the markers that
pick a model's span off its chat template, and the texts that open and close
a span. A span opens only at the very start of a reply (after whitespace), or
before it: a generation prompt that ends inside an open span (DeepSeek-R1 and
Qwen3 thinking templates) means the reply starts inside it. What the span
holds is the reasoning, stripped; what follows its close is the answer, its
leading whitespace stripped. A span never closed is reasoning to the end.

`SpanStream` splits a streamed reply exactly as `SpanFormat.split` splits the
whole one: it holds back text that may yet be a marker (and whitespace the
split would strip), so text already sent is never reclassified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from importlib import resources
from types import MappingProxyType

import yaml

from ...engines.base import Engine, ThinkingBudget
from ..stops import held_tail


@dataclass(frozen=True, slots=True)
class Split:
    """A reply split: `reasoning` None when it had no span ("" for an empty one)."""

    reasoning: str | None
    answer: str


@dataclass(frozen=True, slots=True)
class SpanFormat:
    name: str
    markers: tuple[str, ...]  # any of these in the template text selects this format
    open: str
    close: str

    def opened_by(self, prompt: str) -> bool:
        """Whether a rendered prompt ends inside a span: the reply starts inside it."""
        at = prompt.rfind(self.open)
        return at >= 0 and self.close not in prompt[at + len(self.open) :]

    def split(self, text: str, inside: bool) -> Split:
        """The reasoning and the answer of a whole reply."""
        if not inside:
            body = text.lstrip()
            if not body.startswith(self.open):
                return Split(None, text)
            text = body[len(self.open) :]
        span, closed, answer = text.partition(self.close)
        return Split(span.strip(), answer.lstrip() if closed else "")


def format_of(template: str | None) -> SpanFormat | None:
    """The reasoning span a chat template writes; None when it names none."""
    if not template:
        return None
    return next((f for f in FORMATS.values() if any(m in template for m in f.markers)), None)


class _State(Enum):
    START = "start"  # the reply may still open a span
    REASONING = "reasoning"
    LEAD = "lead"  # after the close: whitespace before the answer is dropped
    ANSWER = "answer"


@dataclass(frozen=True, slots=True)
class Parts:
    """Text safe to send now: reasoning and answer."""

    reasoning: str = ""
    answer: str = ""


class SpanStream:
    """A streamed reply split as `SpanFormat.split` splits the whole one."""

    def __init__(self, span: SpanFormat, inside: bool) -> None:
        self._span = span
        self._state = _State.REASONING if inside else _State.START
        self._held = ""
        self._started = False  # reasoning text was sent (its leading whitespace is gone)

    def push(self, text: str) -> Parts:
        """The parts of the reply so far that no later text can change."""
        self._held += text
        reasoning: list[str] = []
        while True:
            state = self._state
            if state is _State.START:
                body = self._held.lstrip()
                if body.startswith(self._span.open):
                    self._held = body[len(self._span.open) :]
                    self._state = _State.REASONING
                elif self._span.open.startswith(body):  # a marker may be arriving
                    return Parts("".join(reasoning))
                else:
                    self._state = _State.ANSWER
            elif state is _State.REASONING:
                reasoning.append(self._reasoning())
                if self._state is _State.REASONING:
                    return Parts("".join(reasoning))
            elif state is _State.LEAD:
                self._held = self._held.lstrip()
                if not self._held:
                    return Parts("".join(reasoning))
                self._state = _State.ANSWER
            else:
                answer, self._held = self._held, ""
                return Parts("".join(reasoning), answer)

    def _reasoning(self) -> str:
        """Reasoning safe to send; moves to LEAD at the close."""
        if not self._started:
            self._held = self._held.lstrip()
        at = self._held.find(self._span.close)
        if at >= 0:
            out = self._held[:at].rstrip()
            self._held = self._held[at + len(self._span.close) :]
            self._state = _State.LEAD
        else:
            keep = held_tail(self._held, (self._span.close,))
            cut = len(self._held[: len(self._held) - keep].rstrip())
            out, self._held = self._held[:cut], self._held[cut:]
        self._started = self._started or bool(out)
        return out

    def finish(self) -> Parts:
        """What is held, once the reply has ended."""
        held, self._held = self._held, ""
        if self._state is _State.START:
            return Parts(answer=held)  # it never opened a span: all of it is the answer
        if self._state is _State.REASONING:
            return Parts(reasoning=held.rstrip() if self._started else held.strip())
        return Parts()


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    """A chat's span format and, per prompt, whether its reply starts inside a span."""

    span: SpanFormat
    inside: Sequence[bool]
    close_ids: tuple[int, ...] = ()  # the span's close as the tokenizer writes it

    def budget(self, prompt: int, tokens: int | None) -> ThinkingBudget | None:
        """Prompt i's thinking budget (`tokens` at most in the span), or None: no budget."""
        if tokens is None or not self.close_ids:
            return None
        span = self.span
        return ThinkingBudget(tokens, span.open, span.close, self.close_ids, self.inside[prompt])

    def split(self, prompt: int, text: str) -> Split:
        return self.span.split(text, self.inside[prompt])

    def stream(self, prompt: int) -> SpanStream:
        return SpanStream(self.span, self.inside[prompt])


def reasoning_plan(engine: Engine, prompt_ids: Sequence[Sequence[int]]) -> ReasoningPlan | None:
    """The span of the engine's template, and whether each rendered prompt opened one."""
    span = format_of(engine.chat_template)
    if span is None:
        return None
    rendered = (engine.decode(ids, keep_special=True) for ids in prompt_ids)
    close_ids = tuple(engine.tokenize(span.close, add_special_tokens=False))
    return ReasoningPlan(span, tuple(span.opened_by(text) for text in rendered), close_ids)


@cache
def formats() -> Mapping[str, SpanFormat]:
    """The span formats of spec/policy/reasoning_formats.yaml, in its order."""
    path = resources.files("miserver.spec") / "policy" / "reasoning_formats.yaml"
    rows = yaml.safe_load(path.read_text("utf-8"))["formats"]
    return MappingProxyType(
        {
            row["name"]: SpanFormat(
                row["name"], tuple(row["markers"]), str(row["open"]), str(row["close"])
            )
            for row in rows
        }
    )


FORMATS: Mapping[str, SpanFormat] = formats()
