"""A chat stream relayed as a front end's typed events (the Responses and Messages APIs).

Each chat chunk becomes the events the front end makes of it, sent together in one list
(one write); comments (`: waiting for a turn`) pass as they are. A failure after the
stream started ends it with the front end's failure events: a refusal's own, or the
opaque `internal_error` for a fault (logged, never shown), `insufficient_memory` for a
device run out of memory.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from typing import Any

from ..errors import ApiError, fault
from .results import Comment, Encoded

log = logging.getLogger(__name__)

Chunk = dict[str, Any] | Encoded
Sent = list[dict[str, Any]] | Comment  # the events one chat chunk made, or a comment
EXTRAS = ("millm_probe_verdicts", "millm")
"""miserver's members a chat reply carries beside its choices (a stream, on its `choices: []`
chunks before the last): a front end's reply keeps them."""


async def relayed(
    chunks: AsyncGenerator[Chunk | Comment, None],
    made: Callable[[Chunk], Iterable[dict[str, Any]]],
    failed: Callable[[ApiError], Iterable[dict[str, Any]]],
    what: str,
) -> AsyncGenerator[Sent, None]:
    """`chunks` as the events `made` makes of each, `failed`'s on a failure (`what`: the
    front end, for the log)."""
    try:
        async with aclosing(chunks) as source:
            async for chunk in source:
                if isinstance(chunk, Comment):
                    yield chunk
                    continue
                events = list(made(chunk))
                if events:
                    yield events
    except ApiError as exc:
        log.warning("%s stream ended by %s: %s", what, exc.code, exc.message)
        yield list(failed(exc))
    except Exception as exc:
        log.exception("%s stream failed", what)
        yield list(failed(fault(exc)))
