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
    """Prompt i's content chunks, then its finish (the caller adds the usage)."""
    endpoint = prepared.request.endpoint
    if endpoint == "chat":
        yield out.content([shapes.delta(endpoint, i, "", None, role=True)])
    reply = prepared.reply_stream(i)
    output = prepared.output
    document: list[str] = []  # a constrained reply, validated once it ends
    async for event in events:
        if isinstance(event, TextDelta):
            if output is not None:
                document.append(event.text)
            if piece := reply.push(event.text):
                plain = piece.content and not piece.reasoning  # most tokens: made quickly
                yield (
                    out.text(i, piece.content)
                    if plain
                    else out.content([_delta(endpoint, i, piece)])
                )
            continue
        reason = event.finish_reason
        if output is not None:  # an invalid document ends the stream in an error
            reason = output.finish("".join(document), reason)
        piece, calls = reply.finish()
        if piece:
            yield out.content([_delta(endpoint, i, piece)])
        if calls:  # the calls whole, in one delta (OAI-TOOLS-06)
            yield out.content([shapes.delta(endpoint, i, None, None, calls=calls)])
            reason = "tool_calls"
        yield Finished(shapes.delta(endpoint, i, None, reason), event)
        return


def _delta(endpoint: str, i: int, piece: Piece) -> dict[str, Any]:
    """A chunk's choice for `piece`: its content and its reasoning (LOC-CHAT-57)."""
    return shapes.delta(endpoint, i, piece.content or None, None, reasoning=piece.reasoning or None)
