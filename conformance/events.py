"""Server-sent events as the contract frames them (OAI-STREAM-01, -02).

Each event is one `data: <payload>` line ended by a blank line; comment lines
(`: waiting for a turn`) may come between events; the last event is
`data: [DONE]`. `read_stream` splits a whole body into its payloads and
refuses any other framing with a `StreamFramingViolation`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .failures import StreamFramingViolation

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class Stream:
    """The JSON chunks of a stream in order, and whether `data: [DONE]` ended it."""

    chunks: list[dict[str, Any]]
    done: bool


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def payloads(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order; comments dropped."""
    body = text.replace("\r\n", "\n")
    if body and not body.endswith("\n\n"):
        raise StreamFramingViolation(
            "every event ended by a blank line",
            f"the body ends with {_cut(body[-60:])!r}",
            "OAI-STREAM-01",
        )
    found: list[str] = []
    for block in body.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        if len(lines) != 1 or not lines[0].startswith("data: "):
            raise StreamFramingViolation(
                "each event framed as one `data: <json>` line", _cut(repr(block)), "OAI-STREAM-01"
            )
        found.append(lines[0].removeprefix("data: "))
    return found


def read_stream(text: str) -> Stream:
    """The stream's chunks; `[DONE]` must be the last event, and every other one a JSON object."""
    found = payloads(text)
    done_at = [i for i, payload in enumerate(found) if payload == DONE]
    if done_at and done_at[0] != len(found) - 1:
        raise StreamFramingViolation(
            "`data: [DONE]` as the last event",
            f"events after it: {_cut(repr(found[done_at[0] + 1 :]))}",
            "OAI-STREAM-02",
        )
    chunks: list[dict[str, Any]] = []
    for payload in found[: done_at[0]] if done_at else found:
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            raise StreamFramingViolation(
                "each event's data to be a JSON object", _cut(payload), "OAI-STREAM-01"
            )
        chunks.append(chunk)
    return Stream(chunks, bool(done_at))


def typed_events(text: str, requirement: str) -> list[dict[str, Any]]:
    """The events of a typed stream (the Responses API's): each one `event: <type>` line and
    one `data: <json>` line whose `type` is that name, comments allowed, no `[DONE]`."""
    body = text.replace("\r\n", "\n")
    if body and not body.endswith("\n\n"):
        raise StreamFramingViolation(
            "every event ended by a blank line",
            f"the body ends with {_cut(body[-60:])!r}",
            requirement,
        )
    found: list[dict[str, Any]] = []
    for block in body.split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        framed = (
            len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: ")
        )
        try:
            event = json.loads(lines[1].removeprefix("data: ")) if framed else None
        except ValueError:
            event = None
        name = lines[0].removeprefix("event: ") if framed else None
        if not isinstance(event, dict) or event.get("type") != name:
            raise StreamFramingViolation(
                "each event as `event: <type>` and `data: <json object of that type>`",
                _cut(repr(block)),
                requirement,
            )
        found.append(event)
    return found
