"""One streamed choice's chunks: its role, its text pieces, its finish.

A piece of plain text goes out on the per-token fast path (`Chunks.text`,
an `Encoded` string); reasoning, a constrained document (validated once it
ends) and tool calls (whole, in one delta: OAI-TOOLS-06) go out as chunk
dicts. The choice's `Finished` carries its last chunk's choice and its end;
the service adds the usage and what follows the choices.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..chat.replies import Piece
from ..results import Encoded
from . import shapes
from .generation import ChoiceEnd, TextDelta
from .logprobs import Shaper, TokenLogprob
from .prepared import Prepared


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
) -> AsyncIterator[dict[str, Any] | Encoded | Finished]:
    """Prompt i's content chunks, then its finish (the caller adds the usage). With
    `logprobs`, the tokens reported ride on the next chunk that goes out after them (a piece
    held back, reasoning or calls, passes them on), the last ones on the finish."""
    endpoint = prepared.request.endpoint
    if endpoint == "chat":
        yield out.content([shapes.delta(endpoint, i, "", None, role=True)])
    reply = prepared.reply_stream(i)
    output = prepared.output
    reports = Reports(prepared.shaper(i)) if prepared.request.logprobs is not None else None
    document: list[str] = []  # a constrained reply, validated once it ends
    async for event in events:
        if isinstance(event, TextDelta):
            if event.prompt:  # echo: the prompt's text and its tokens, first
                lp = None if reports is None else reports.echoed(event)
                yield out.content([shapes.delta(endpoint, i, event.text, None, logprobs=lp)])
                continue
            if output is not None:
                document.append(event.text)
            if reports is not None:
                reports.add(event)
            if piece := reply.push(event.text):
                plain = piece.content and not piece.reasoning and reports is None
                yield (
                    out.text(i, piece.content)
                    if plain
                    else out.content([_delta(endpoint, i, piece, reports)])
                )
            continue
        reason = event.finish_reason
        if output is not None:  # an invalid document ends the stream in an error
            reason = output.finish("".join(document), reason)
        piece, calls = reply.finish()
        if piece:
            yield out.content([_delta(endpoint, i, piece, reports)])
        if calls:  # the calls whole, in one delta (OAI-TOOLS-06)
            lp = None if reports is None else reports.taken()
            yield out.content([shapes.delta(endpoint, i, None, None, calls=calls, logprobs=lp)])
            reason = "tool_calls"
        lp = None if reports is None else reports.taken()
        yield Finished(shapes.delta(endpoint, i, None, reason, logprobs=lp), event)
        return


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
