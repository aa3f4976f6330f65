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
class Encoded:
    """A chunk already written as JSON text: a stream's per-token chunks, made from a
    template of their stream (serving/completions/shapes.py) rather than a dict each."""

    json: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole JSON body and the headers that go with it."""

    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class StreamReply:
    """Events to send as SSE `data:` lines (or comments), and the response's headers."""

    events: AsyncGenerator[dict[str, Any] | Encoded | Comment, None]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class TypedStreamReply:
    """Typed events (the Responses API's: `event: <type>`), those made together in one list,
    or comments; and the response's headers."""

    events: AsyncGenerator[list[dict[str, Any]] | Comment, None]
    headers: dict[str, str]
