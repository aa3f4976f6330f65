"""Where a choice's events cross to the event loop (serving/completions/generation.py).

LOC-CHAT-51 (a client that leaves frees the slot; its generation stops at the next token):
the reader of a choice that started before its stream's first chunk went out must stop the
choice even when it is dropped unread. OAI-CHAT-05: a JSON (non-stream) choice's text
crosses whole, in one delta, and is the same text a stream sends piece by piece.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from miserver.engines.base import SamplingParams, Token
from miserver.serving.completions.generation import (
    ChoiceEnd,
    ChoiceJob,
    ChoiceText,
    Event,
    Inbox,
    TextDelta,
)


def test_a_reader_dropped_unstarted_cancels_its_choice() -> None:
    """LOC-CHAT-51: a stream closed at its role chunk stops the choice."""

    async def main() -> bool:
        inbox = Inbox()
        reader = inbox.read()
        assert not inbox.cancel.is_set()
        del reader
        gc.collect()
        return inbox.cancel.is_set()

    assert asyncio.run(main())


def test_a_reader_read_to_the_end_sets_cancel_once_done() -> None:
    """The end event ends the reader; the choice's cancel flag is set as it closes."""

    async def main() -> tuple[list[Event], bool]:
        inbox = Inbox()
        inbox.put(TextDelta("a"))
        inbox.put(ChoiceEnd("stop", 1))
        got = [event async for event in inbox.read()]
        return got, inbox.cancel.is_set()

    got, cancelled = asyncio.run(main())
    assert got == [TextDelta("a"), ChoiceEnd("stop", 1)] and cancelled


class _Engine:
    """Decodes each id to one letter: enough for ChoiceText's detokenizer."""

    def decode(self, ids: Any, *, keep_special: bool = False) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _push_all(whole: bool) -> list[Event]:
    events: list[Event] = []
    job = ChoiceJob(
        prompt_ids=[0], params=SamplingParams(max_tokens=3), stop_strings=(), rng=None, whole=whole
    )
    text = ChoiceText(_Engine(), job, threading.Event(), events.append)  # type: ignore[arg-type]
    for token_id in (0, 1, 2):
        assert text.push(Token(token_id=token_id, eos=False), 0.0) is None
    events.append(text.finish("length"))
    return events


def test_a_whole_choice_sends_its_text_in_one_delta_before_its_end() -> None:
    """OAI-CHAT-05: the JSON path reads the same text either way; whole, it crosses once."""
    streamed, whole = _push_all(whole=False), _push_all(whole=True)
    assert streamed == [TextDelta("a"), TextDelta("b"), TextDelta("c"), ChoiceEnd("length", 3)]
    assert whole == [TextDelta("abc"), ChoiceEnd("length", 3)]
