"""Server-sent event framing (OAI-STREAM-01).

Each chunk is `data: <json>\\n\\n`; a comment is `: text\\n\\n`; a failure after
the stream started becomes one `data: {"error": ...}` event; `data: [DONE]`
always ends a stream that was not abandoned by its client.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from ..errors import ApiError, fault
from ..serving.results import Comment, Encoded

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


def named(name: str, payload: dict[str, Any]) -> bytes:
    """One named event: `event: <name>` and `data: <json>` (LOC-EVENTS-02)."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    return b"event: " + name.encode("ascii") + b"\ndata: " + body + b"\n\n"


def data(payload: dict[str, Any]) -> bytes:
    return _data(json.dumps(payload, ensure_ascii=False))


def _data(text: str) -> bytes:
    """One `data:` event of JSON text."""
    return b"data: " + text.encode("utf-8") + b"\n\n"


async def frames(
    events: AsyncGenerator[dict[str, Any] | Encoded | Comment, None],
) -> AsyncIterator[bytes]:
    """The wire bytes of a stream of chunks."""
    async with aclosing(events) as source:
        try:
            async for event in source:
                if isinstance(event, Encoded):
                    yield _data(event.json)
                elif isinstance(event, Comment):
                    yield f": {event.text}\n\n".encode()
                else:
                    yield data(event)
        except ApiError as exc:
            log.warning("stream ended by %s: %s", exc.code, exc.message)
            yield data(exc.body())
        except Exception as exc:
            log.exception("stream failed")
            yield data(fault(exc).body())  # insufficient_memory too (OAI-ERR-29)
    yield DONE


async def typed_frames(
    events: AsyncGenerator[list[dict[str, Any]] | Comment, None],
) -> AsyncIterator[bytes]:
    """The wire bytes of a typed event stream: each event named by its `type`, the events
    made together written together."""
    async with aclosing(events) as source:
        async for made in source:
            if isinstance(made, Comment):
                yield f": {made.text}\n\n".encode()
            else:
                yield b"".join(named(str(event["type"]), event) for event in made)
