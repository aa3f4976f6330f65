"""What a /v1 service hands back to its handler: a JSON reply, or a stream of events."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Comment:
    """An SSE comment line (`: text`)."""

    text: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole JSON body and the headers that go with it."""

    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class StreamReply:
    """Events to send as SSE `data:` lines (or comments), and the response's headers."""

    events: AsyncGenerator[dict[str, Any] | Comment, None]
    headers: dict[str, str]
