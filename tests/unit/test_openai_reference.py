"""The OpenAI reference-schema check (tests/openai_reference.py) on recorded bodies."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import struct
from typing import Any

import pytest

from tests import openai_reference as ref
from tests.openai_reference import Check, SchemaViolation, http, schema_name, violations

CHAT: dict[str, Any] = {
    "id": "chatcmpl-0a1b2c",
    "object": "chat.completion",
    "created": 1764590000,
    "model": "SmolLM2-135M-Instruct:Q4_1",
    "system_fingerprint": "millm:SmolLM2-135M-Instruct@unrecorded:Q4_1/Q4_1:llama.cpp",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    "millm_steering": {"applied": []},
}
CHUNK: dict[str, Any] = {
    "id": "chatcmpl-0a1b2c",
    "object": "chat.completion.chunk",
    "created": 1764590000,
    "model": "SmolLM2-135M-Instruct:Q4_1",
    "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}
    ],
}
LAST_CHUNK: dict[str, Any] = {
    **CHUNK,
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
    "millm_steering": {"applied": []},
}
COMPLETION_CHUNK: dict[str, Any] = {
    "id": "cmpl-0a1b2c",
    "object": "text_completion",
    "created": 1764590000,
    "model": "SmolLM2-135M-Instruct:Q4_1",
    "choices": [{"index": 0, "text": " three", "logprobs": None, "finish_reason": None}],
    "usage": None,
}
ERROR: dict[str, Any] = {
    "error": {
        "message": "seed must be at most 4294967295",
        "type": "invalid_request_error",
        "param": "seed",
        "code": "invalid_parameter",
    }
}
VECTOR = [0.25, -1.5, 3.0]
PACKED = base64.b64encode(struct.pack("<3f", *VECTOR)).decode("ascii")
"""VECTOR as the server sends it for `encoding_format: "base64"` (OAI-EMB-04)."""


def embeddings(embedding: object) -> dict[str, Any]:
    return {
        "object": "list",
        "model": "SmolLM2-135M-Instruct",
        "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }


def changed(body: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A deep copy of `body` with the member at dotted `path` set (or removed, for ...)."""
    copied = copy.deepcopy(body)
    *parents, last = path.split(".")
    target: Any = copied
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return copied


@pytest.mark.parametrize(
    ("path", "status", "event", "expected"),
    [
        ("/v1/chat/completions", 200, None, "CreateChatCompletionResponse"),
        ("/v1/chat/completions", 200, CHUNK, "CreateChatCompletionStreamResponse"),
        ("/v1/chat/completions", 200, ERROR, "ErrorResponse"),
        ("/v1/completions", 200, None, "CreateCompletionResponse"),
        ("/v1/completions", 200, COMPLETION_CHUNK, ref.COMPLETION_CHUNK),
        ("/v1/embeddings", 200, None, "CreateEmbeddingResponse"),
        ("/v1/models", 200, None, "ListModelsResponse"),
        ("/v1/models/SmolLM2-135M-Instruct:Q4_1", 200, None, "Model"),
        ("/v1/chat/completions", 400, None, "ErrorResponse"),
        ("/v1/no-such-route", 404, None, "ErrorResponse"),
        ("/v1/no-such-route", 200, None, None),
        ("/api/models", 200, None, None),
    ],
)
def test_the_route_names_the_schema(
    path: str, status: int, event: dict[str, Any] | None, expected: str | None
) -> None:
    """OAI-GEN-02, OAI-ERR-01: each body answers to OpenAI's schema for its route."""
    assert schema_name(path, status, event=event) == expected


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("CreateChatCompletionResponse", CHAT),
        ("CreateChatCompletionStreamResponse", CHUNK),
        ("CreateChatCompletionStreamResponse", LAST_CHUNK),
        (ref.COMPLETION_CHUNK, COMPLETION_CHUNK),
        (ref.COMPLETION_CHUNK, changed(COMPLETION_CHUNK, "choices.0.finish_reason", "length")),
        ("CreateEmbeddingResponse", embeddings(VECTOR)),
        ("CreateEmbeddingResponse", embeddings(PACKED)),
        ("ErrorResponse", ERROR),
        ("ListModelsResponse", {"object": "list", "data": []}),
        ("Model", {"id": "m", "object": "model", "created": 0, "owned_by": "o", "state": "READY"}),
    ],
)
def test_valid_bodies_pass_with_our_extension_members(name: str, body: dict[str, Any]) -> None:
    """OAI-RESP-01..07, OAI-STREAM-03, OAI-STREAM-10, OAI-EMB-04, OAI-MODELS-02, OAI-ERR-01:
    `millm_*` members and a model's `state` are allowed extras; base64 vectors decode."""
    assert violations(name, body) == []


@pytest.mark.parametrize(
    ("name", "body", "where"),
    [
        (
            "CreateChatCompletionResponse",
            changed(CHAT, "choices.0.message.refusal", ...),
            "$.choices[0].message",
        ),
        ("CreateChatCompletionResponse", changed(CHAT, "choices.0.logprobs", ...), "$.choices[0]"),
        (
            "CreateChatCompletionResponse",
            changed(CHAT, "choices.0.finish_reason", "eos"),
            "$.choices[0].finish_reason",
        ),
        (
            "CreateChatCompletionResponse",
            changed(CHAT, "usage.total_tokens", "12"),
            "$.usage.total_tokens",
        ),
        (
            "CreateChatCompletionStreamResponse",
            changed(CHUNK, "object", "chat.completion"),
            "$.object",
        ),
        ("CreateChatCompletionStreamResponse", changed(LAST_CHUNK, "id", ...), "$"),
        (
            "CreateCompletionResponse",
            changed(COMPLETION_CHUNK, "usage", ...),
            "$.choices[0].finish_reason",
        ),
        ("CreateCompletionResponse", changed(COMPLETION_CHUNK, "choices", []), "$.usage"),
        ("CreateEmbeddingResponse", embeddings("not base64!"), "$.data[0].embedding"),
        ("CreateEmbeddingResponse", embeddings(PACKED[:-4] + "AA=="), "$.data[0].embedding"),
        ("ErrorResponse", changed(ERROR, "error.param", ...), "$.error"),
        ("ErrorResponse", {"detail": "Not Found"}, "$"),
    ],
)
def test_invalid_bodies_fail_at_their_json_path(
    name: str, body: dict[str, Any], where: str
) -> None:
    """OAI-RESP-05, OAI-STREAM-03, OAI-EMB-04, OAI-ERR-01: the first problem names its path."""
    found = violations(name, body)
    assert found, f"{name} accepted {json.dumps(body)}"
    assert found[0].startswith(f"{where}: "), found


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n" for e in events
    )


def mock(body: bytes, status: int = 200, media: str = "text/event-stream") -> http.MockTransport:
    return http.MockTransport(
        lambda request: http.Response(status, content=body, headers={"content-type": media})
    )


URL = "http://127.0.0.1:1/v1/chat/completions"


def read(body: bytes, status: int = 200, media: str = "text/event-stream") -> Check:
    check = Check()
    transport = ref.ValidatingTransport(check, mock(body, status, media))
    with http.Client(transport=transport) as client, client.stream("POST", URL) as response:
        for _ in response.iter_lines():
            pass
    return check


def test_the_transport_checks_every_stream_event() -> None:
    """OAI-STREAM-01..03, OAI-STREAM-10: each `data:` event is checked; comments skipped."""
    check = read(b": keep-alive\n\n" + sse(CHUNK, LAST_CHUNK, "[DONE]"))
    assert check.problems == []
    assert [r.schema for r in check.received] == ["CreateChatCompletionStreamResponse"] * 2


def test_the_first_invalid_event_fails_the_read() -> None:
    """OAI-STREAM-03: a bad chunk raises while the client reads, naming where and why."""
    bad = changed(CHUNK, "choices.0.finish_reason", "eos")
    with pytest.raises(SchemaViolation, match=r"\$\.choices\[0\]\.finish_reason"):
        read(sse(CHUNK, bad, LAST_CHUNK, "[DONE]"))


def test_a_stream_must_end_with_done_and_errors_are_error_bodies() -> None:
    """OAI-STREAM-02, OAI-STREAM-06: `[DONE]` ends a stream; an error event is an ErrorResponse."""
    with pytest.raises(SchemaViolation, match=r"without \[DONE\]"):
        read(sse(CHUNK))
    assert read(sse(CHUNK, ERROR, "[DONE]")).received[-1].schema == "ErrorResponse"
    with pytest.raises(SchemaViolation, match="ErrorResponse"):
        read(sse(CHUNK, {"error": "boom"}, "[DONE]"))


def test_json_bodies_and_errors_are_checked() -> None:
    """OAI-RESP-01..05, OAI-ERR-01: a whole body, and a 4xx body, against their schemas."""
    assert read(json.dumps(CHAT).encode(), media="application/json").problems == []
    with pytest.raises(SchemaViolation, match=r"ErrorResponse at \$\.error"):
        read(json.dumps({"error": {"message": "m"}}).encode(), 400, "application/json")
    with pytest.raises(SchemaViolation, match="neither JSON nor SSE"):
        read(b"Internal Server Error", 500, "text/plain")


def test_the_async_transport_checks_too() -> None:
    """OAI-STREAM-03: the async client's stream is checked event by event."""
    check = Check()
    bad = changed(CHUNK, "created", "now")

    async def main() -> None:
        transport = ref.AsyncValidatingTransport(check, mock(sse(CHUNK, bad, "[DONE]")))
        async with (
            http.AsyncClient(transport=transport) as client,
            client.stream("POST", URL) as response,
        ):
            async for _ in response.aiter_lines():
                pass

    with pytest.raises(SchemaViolation, match=r"\$\.created"):
        asyncio.run(main())
    assert len(check.problems) == 1
