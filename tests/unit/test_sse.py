"""SSE framing: chunks, comments, a mid-stream failure, [DONE]."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from miserver.errors import ApiError
from miserver.http.sse import frames
from miserver.serving.results import Comment


async def _collect(source: AsyncGenerator[dict[str, Any] | Comment, None]) -> list[bytes]:
    return [frame async for frame in frames(source)]


def test_chunks_and_comments_then_done() -> None:
    """OAI-STREAM-01, OAI-STREAM-02: `data: {json}\\n\\n` frames, comments, `data: [DONE]` last."""

    async def source() -> AsyncGenerator[dict[str, Any] | Comment, None]:
        yield Comment("waiting for a turn")
        yield {"a": 1}

    assert asyncio.run(_collect(source())) == [
        b": waiting for a turn\n\n",
        b'data: {"a": 1}\n\n',
        b"data: [DONE]\n\n",
    ]


def test_a_failure_mid_stream_is_an_error_event_then_done() -> None:
    """OAI-STREAM-06, OAI-ERR-07: an error object event, then [DONE]; the status stays 200."""

    async def source() -> AsyncGenerator[dict[str, Any] | Comment, None]:
        yield {"a": 1}
        raise ApiError("context_length_exceeded", "too long", "messages")

    frames_ = asyncio.run(_collect(source()))
    assert frames_[-1] == b"data: [DONE]\n\n"
    error = json.loads(frames_[-2].removeprefix(b"data: "))
    assert error == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_a_server_fault_mid_stream_carries_no_stack() -> None:
    """OAI-STREAM-06: an unexpected failure becomes internal_error, with no exception text."""

    async def source() -> AsyncGenerator[dict[str, Any] | Comment, None]:
        raise RuntimeError("secret detail")
        yield {}

    frames_ = asyncio.run(_collect(source()))
    assert b"secret" not in b"".join(frames_)
    assert json.loads(frames_[0].removeprefix(b"data: "))["error"]["code"] == "internal_error"
