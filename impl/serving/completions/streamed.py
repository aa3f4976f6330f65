"""One streamed choice's chunks: its role, its text pieces, its finish.

A piece of plain text goes out on the per-token fast path (`Chunks.text`,
an `Encoded` string); reasoning, a constrained document (validated once it
ends) and tool calls (whole, in one delta: OAI-TOOLS-06) go out as chunk
dicts. The choice's `Finished` carries its last chunk's choice and its end;
the service adds the usage and what follows the choices.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..chat.replies import Piece, ReplyStream
from ..results import Encoded
from . import shapes
from .generation import ChoiceEnd, TextDelta
from .logprobs import Shaper, TokenLogprob
from .prepared import Prepared

SoFar = Callable[[int, int], dict[str, Any]]  # (generated, cached) of this choice -> usage


@dataclass(frozen=True, slots=True)
class Finished:
    """A streamed choice's finish: its last chunk's choice and its counts."""

    choice: dict[str, Any]
    end: ChoiceEnd


async def choice_chunks(
    prepared: Prepared,
    out: shapes.Chunks,
    i: int,
    events: AsyncIterator[TextDelta | ChoiceEnd],
    so_far: SoFar | None = None,
) -> AsyncIterator[dict[str, Any] | Encoded | Finished]:
    """Prompt i's content chunks, then its finish (the caller adds the usage). With
    `logprobs`, the tokens reported ride on the next chunk that goes out after them (a piece
    held back, reasoning or calls, passes them on), the last ones on the finish. With
    `so_far` (continuous usage), each chunk carries the usage as it stands then, and a
    chat's role chunk waits for the prompt to run, so that its usage counts what was cached."""
    choice = _Choice(prepared, out, i, Running(so_far))
    role = prepared.request.endpoint == "chat"
    if role and so_far is None:
        yield choice.role()
        role = False
    async for event in events:
        choice.running.saw(event)
        if role:
            yield choice.role()
            role = False
        if isinstance(event, TextDelta):
            chunk = choice.piece(event)
            if chunk is not None:
                yield chunk
            continue
        for item in choice.ending(event):
            yield item
        return


class _Choice:
    """One streamed choice's state between its events: its reply's held-back text, its
    constrained document, its reported tokens, its usage so far."""

    def __init__(self, prepared: Prepared, out: shapes.Chunks, i: int, running: Running) -> None:
        self.endpoint = prepared.request.endpoint
        self.out, self.i, self.running = out, i, running
        self.reply = prepared.reply_stream(i)
        self.output = prepared.output
        logprobs = prepared.request.logprobs is not None
        self.reports = Reports(prepared.shaper(i)) if logprobs else None
        self.fast = not logprobs and running.so_far is None  # plain text: `Chunks.text`
        self.document: list[str] = []  # a constrained reply, validated once it ends

    def role(self) -> dict[str, Any]:
        delta = shapes.delta("chat", self.i, "", None, role=True)
        return self.out.content([delta], self.running.usage())

    def piece(self, event: TextDelta) -> dict[str, Any] | Encoded | None:
        """The chunk a text piece makes, if any goes out now."""
        endpoint, i, reports = self.endpoint, self.i, self.reports
        if event.prompt:  # echo: the prompt's text and its tokens, first
            lp = None if reports is None else reports.echoed(event)
            delta = shapes.delta(endpoint, i, event.text, None, logprobs=lp)
            return self.out.content([delta], self.running.usage())
        if self.output is not None:
            self.document.append(event.text)
        if reports is not None:
            reports.add(event)
        piece = self.reply.push(event.text)
        if not piece:
            return None
        if self.fast and piece.content and not piece.reasoning:
            return self.out.text(i, piece.content)
        return self.out.content([_delta(endpoint, i, piece, reports)], self.running.usage())

    def ending(self, event: ChoiceEnd) -> list[dict[str, Any] | Finished]:
        """What the reply held back, then the finish."""
        reason = event.finish_reason
        if self.output is not None:  # an invalid document ends the stream in an error
            reason = self.output.finish("".join(self.document), reason)
        deltas, called = _held_back(self.endpoint, self.i, self.reply, self.reports)
        items: list[dict[str, Any] | Finished] = [
            self.out.content([delta], self.running.usage()) for delta in deltas
        ]
        reason = "tool_calls" if called else reason
        lp = None if self.reports is None else self.reports.taken()
        finish = shapes.delta(self.endpoint, self.i, None, reason, logprobs=lp)
        items.append(Finished(shapes.with_stop(finish, event.stop), event))
        return items


@dataclass(slots=True)
class Running:
    """A streamed choice's usage as its newest event left it (`continuous_usage_stats`):
    None on every chunk when not asked for (`so_far` None)."""

    so_far: SoFar | None
    counts: tuple[int, int] = (0, 0)  # (generated, cached)

    def saw(self, event: TextDelta | ChoiceEnd) -> None:
        if isinstance(event, TextDelta):
            self.counts = (event.generated, event.cached)
        else:
            self.counts = (event.completion_tokens, event.cached_tokens)

    def usage(self) -> dict[str, Any] | None:
        return None if self.so_far is None else self.so_far(*self.counts)


def _held_back(
    endpoint: str, i: int, reply: ReplyStream, reports: Reports | None
) -> tuple[list[dict[str, Any]], bool]:
    """What the reply held back, as the deltas before the finish: its last piece, then its
    calls whole, in one delta (OAI-TOOLS-06); whether it called."""
    piece, calls = reply.finish()
    deltas = [_delta(endpoint, i, piece, reports)] if piece else []
    if calls:
        lp = None if reports is None else reports.taken()
        deltas.append(shapes.delta(endpoint, i, None, None, calls=calls, logprobs=lp))
    return deltas, bool(calls)


class Reports:
    """A streamed choice's reported tokens not yet sent, shaped as each chunk goes out."""

    def __init__(self, shaper: Shaper) -> None:
        self._shaper = shaper
        self._waiting: list[TokenLogprob] = []

    def add(self, event: TextDelta) -> None:
        self._waiting.extend(event.logprobs)

    def echoed(self, event: TextDelta) -> dict[str, Any]:
        return self._shaper.echoed(event.logprobs, event.text)

    def taken(self) -> dict[str, Any] | None:
        """The waiting tokens' `logprobs` object, for the chunk going out; None when none
        wait (a chat chunk without tokens says `logprobs: null`)."""
        if not self._waiting:
            return None
        shaped = self._shaper.shaped(self._waiting)
        self._waiting = []
        return shaped


def _delta(endpoint: str, i: int, piece: Piece, reports: Reports | None) -> dict[str, Any]:
    """A chunk's choice for `piece`: its content and its reasoning (LOC-CHAT-57), and the
    tokens reported since the last chunk."""
    lp = None if reports is None else reports.taken()
    return shapes.delta(
        endpoint, i, piece.content or None, None, reasoning=piece.reasoning or None, logprobs=lp
    )
