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
    ChoiceEvent,
    ChoiceFailed,
    ChoiceJob,
    ChoiceText,
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

    async def main() -> tuple[list[ChoiceEvent], bool]:
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


def _push_all(whole: bool) -> list[ChoiceEvent]:
    events: list[ChoiceEvent] = []
    job = ChoiceJob(
        prompt_ids=[0], params=SamplingParams(max_tokens=3), stop_strings=(), rng=None, whole=whole
    )
    text = ChoiceText(_Engine(), job, threading.Event(), events.append)  # type: ignore[arg-type]
    for token_id in (0, 1, 2):
        assert text.push(Token(token_id=token_id, eos=False), 0.0) is None
    events.append(text.finish("length"))
    return events


def test_a_whole_choice_sends_its_text_in_one_delta_before_its_end() -> None:
    """OAI-CHAT-05: the JSON path reads the same text either way; whole, it crosses once.
    Each piece says how many tokens the choice had made when it went out (issue 43: a
    stream's continuous usage)."""
    streamed, whole = _push_all(whole=False), _push_all(whole=True)
    pieces = [TextDelta(t, generated=n) for n, t in enumerate("abc", start=1)]
    assert streamed == [*pieces, ChoiceEnd("length", 3)]
    assert whole == [TextDelta("abc", generated=3), ChoiceEnd("length", 3)]


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    """Let every callback and task that is ready run."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_pieces_within_the_pace_wait_and_go_out_joined() -> None:
    """OAI-STREAM-03, OAI-STREAM-01 (docs/DECISIONS.md, a stream's text paced): the first piece
    wakes the reader at once; a piece within `pace` of the last wake waits; the next one past
    it wakes the reader, which reads both as one piece; an end wakes it at once, after the
    pieces that waited."""

    async def main() -> list[list[ChoiceEvent]]:
        clock = _Clock()
        inbox = Inbox(pace=0.05, clock=clock)
        got: list[ChoiceEvent] = []
        seen: list[list[ChoiceEvent]] = []

        async def read() -> None:
            async for event in inbox.read():
                got.append(event)

        reader = asyncio.create_task(read())
        await _settle()
        inbox.emit(TextDelta("a"))  # the first: at once
        await _settle()
        seen.append(list(got))
        clock.now += 0.01
        inbox.emit(TextDelta("b"))  # within the pace: waits
        clock.now += 0.01
        inbox.put(TextDelta("c"))  # the loop's own put paces alike
        await _settle()
        seen.append(list(got))
        clock.now += 0.04  # 0.06 since "a" woke the reader
        inbox.emit(TextDelta("d"))
        await _settle()
        seen.append(list(got))
        clock.now += 0.001
        inbox.emit(TextDelta("e"))  # waits, then goes out with the end
        inbox.emit(ChoiceEnd("stop", 5))
        await reader
        seen.append(list(got))
        return seen

    first, waiting, woken, ended = asyncio.run(main())
    assert first == [TextDelta("a")]
    assert waiting == first
    assert woken == [TextDelta("a"), TextDelta("bcd")]
    assert ended == [TextDelta("a"), TextDelta("bcd"), TextDelta("e"), ChoiceEnd("stop", 5)]


def test_a_held_piece_waits_in_the_inbox_and_one_due_is_refused() -> None:
    """Issue 43 (batching.py `Batcher._post`): from the engine's thread, a piece within the
    pace is kept without waking the reader (the batch's steps go on); a piece past the pace
    and an end are refused, to be `put` on the loop's thread, which wakes the reader with
    every piece kept before, joined, in order; with no pace nothing is held."""

    async def main() -> tuple[list[bool], list[ChoiceEvent], list[ChoiceEvent]]:
        clock = _Clock()
        inbox = Inbox(pace=0.05, clock=clock)
        got: list[ChoiceEvent] = []

        async def read() -> None:
            async for event in inbox.read():
                got.append(event)

        reader = asyncio.create_task(read())
        await _settle()
        held = [inbox.hold(TextDelta("a"))]  # the first piece is due: refused
        inbox.put(TextDelta("a"))
        await _settle()
        clock.now += 0.01
        held += [inbox.hold(TextDelta("b")), inbox.hold(TextDelta("c"))]
        await _settle()
        before = list(got)
        clock.now += 0.05
        held.append(inbox.hold(TextDelta("d")))  # past the pace: refused
        inbox.put(TextDelta("d"))
        held.append(inbox.hold(ChoiceEnd("stop", 4)))  # an end is never held
        inbox.put(ChoiceEnd("stop", 4))
        await reader
        held.append(Inbox(pace=0.0, clock=clock).hold(TextDelta("e")))  # no pace: never held
        return held, before, got

    held, before, got = asyncio.run(main())
    assert held == [False, True, True, False, False, False]
    assert before == [TextDelta("a")]
    assert got == [TextDelta("a"), TextDelta("bcd"), ChoiceEnd("stop", 4)]


def test_no_pace_wakes_the_reader_for_every_piece() -> None:
    """`--stream-interval 0`: each piece goes out alone, as it is made (OAI-STREAM-03)."""

    async def main() -> list[ChoiceEvent]:
        inbox = Inbox(pace=0.0, clock=_Clock())
        got: list[ChoiceEvent] = []

        async def read() -> None:
            async for event in inbox.read():
                got.append(event)

        reader = asyncio.create_task(read())
        for piece in "abc":
            await _settle()
            inbox.emit(TextDelta(piece))
            await _settle()
            assert got[-1] == TextDelta(piece)
        inbox.emit(ChoiceEnd("length", 3))
        await reader
        return got

    assert asyncio.run(main()) == [*(TextDelta(p) for p in "abc"), ChoiceEnd("length", 3)]


def test_a_failure_wakes_the_reader_and_the_waiting_pieces_go_first() -> None:
    """OAI-STREAM-06: a failure mid-stream reaches the reader at once, after the text that
    waited, so the client has every piece made before the error event."""

    async def main() -> list[ChoiceEvent]:
        clock = _Clock()
        inbox = Inbox(pace=10.0, clock=clock)
        failure = ChoiceFailed(RuntimeError("boom"))
        inbox.emit(TextDelta("a"))
        inbox.emit(TextDelta("b"))
        inbox.emit(failure)
        return [event async for event in inbox.read()]

    got = asyncio.run(main())
    assert got[0] == TextDelta("ab") and isinstance(got[1], ChoiceFailed) and len(got) == 2


class _CountingEngine(_Engine):
    """`_Engine`, counting its decodes."""

    def __init__(self) -> None:
        self.decodes = 0

    def decode(self, ids: Any, *, keep_special: bool = False) -> str:
        self.decodes += 1
        return super().decode(ids, keep_special=keep_special)


def test_a_whole_choice_without_stops_detokenizes_at_its_end() -> None:
    """OAI-CHAT-05 (docs/DECISIONS.md, a whole reply's text at its end): a JSON choice with no
    stop string decodes nothing while it generates, and its text is the stream's; with a stop
    string it still reads every token's text, and stops at the token that completes it
    (OAI-CHAT-20)."""
    engine = _CountingEngine()
    plain = ChoiceJob(
        prompt_ids=[0], params=SamplingParams(max_tokens=4), stop_strings=(), rng=None, whole=True
    )
    events: list[ChoiceEvent] = []
    text = ChoiceText(engine, plain, threading.Event(), events.append)  # type: ignore[arg-type]
    for token_id in (0, 1, 2):
        assert text.push(Token(token_id=token_id, eos=False), 0.0) is None
    assert engine.decodes == 0 and events == []
    events.append(text.finish("length"))
    assert events == [TextDelta("abc", generated=3), ChoiceEnd("length", 3)]

    stopped = ChoiceJob(
        prompt_ids=[0],
        params=SamplingParams(max_tokens=4),
        stop_strings=("c",),
        rng=None,
        whole=True,
    )
    events.clear()
    text = ChoiceText(_Engine(), stopped, threading.Event(), events.append)  # type: ignore[arg-type]
    ends = [text.push(Token(token_id=token_id, eos=False), 0.0) for token_id in (0, 1, 2)]
    assert ends[:2] == [None, None] and ends[2] == ChoiceEnd(
        "stop", 3, stop="c"
    )  # the sequence named
    assert events == [TextDelta("ab", generated=3)]


def test_a_whole_choice_cancelled_sends_the_text_it_made() -> None:
    """LOC-CHAT-51: a cancelled whole choice ends with the text of the tokens it took."""
    cancel = threading.Event()
    job = ChoiceJob(
        prompt_ids=[0], params=SamplingParams(max_tokens=4), stop_strings=(), rng=None, whole=True
    )
    events: list[ChoiceEvent] = []
    text = ChoiceText(_Engine(), job, cancel, events.append)  # type: ignore[arg-type]
    assert text.push(Token(token_id=0, eos=False), 0.0) is None
    cancel.set()
    end = text.push(Token(token_id=1, eos=False), 0.0)
    assert end == ChoiceEnd("cancelled", 2) and events == [TextDelta("ab", generated=2)]
