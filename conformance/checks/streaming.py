"""Streams: SSE framing, chunk order, usage and `[DONE]` (REQ-000 STREAM, HDR-12..15).

A chat stream with `stream_options.include_usage` must be: a first chunk
with `delta.role`, content chunks, one last choice chunk with
`finish_reason` (and `usage`, OAI-STREAM-05), then extension chunks with
`choices: []` (OpenAI's usage chunk, `millm_steering`, ...), then
`data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..context import Context
from ..events import Stream, read_stream
from ..failures import HeaderViolation, NotOffered, StreamFramingViolation
from ..headers import HeaderGrammarError, parse_steering
from ..registry import check
from ..responses import expect_status

STEERING = "X-miLLM-Steering"
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")


def _cut(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def streamed(ctx: Context, path: str, body: dict[str, Any]) -> tuple[httpx.Response, Stream]:
    response = ctx.post(path, body)
    expect_status(response, 200, "OAI-EP-01" if path == "/chat/completions" else "OAI-EP-02")
    kind = response.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        raise StreamFramingViolation("Content-Type text/event-stream", kind, "OAI-STREAM-01")
    stream = read_stream(response.text)
    if not stream.done:
        last = stream.chunks[-1] if stream.chunks else "nothing"
        raise StreamFramingViolation(
            "`data: [DONE]` as the last event",
            f"the stream ended after {_cut(last)}",
            "OAI-STREAM-02",
        )
    return response, stream


def _split(stream: Stream, obj: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(choice chunks, extension chunks); every chunk has `object`; extensions come last."""
    for chunk in stream.chunks:
        if chunk.get("object") != obj or not isinstance(chunk.get("choices"), list):
            raise StreamFramingViolation(
                f'every chunk {{"object": "{obj}", "choices": [...]}}', _cut(chunk), "OAI-STREAM-03"
            )
    with_choices = [i for i, chunk in enumerate(stream.chunks) if chunk["choices"]]
    if not with_choices:
        raise StreamFramingViolation("at least one choice chunk", "none", "OAI-STREAM-03")
    last = with_choices[-1]
    if not all(isinstance(stream.chunks[i]["choices"][0], dict) for i in with_choices):
        raise StreamFramingViolation(
            "each choice an object", _cut(stream.chunks[: last + 1]), "OAI-STREAM-03"
        )
    if with_choices != list(range(last + 1)):
        raise StreamFramingViolation(
            "extension chunks (choices: []) only after the final choice chunk",
            _cut(stream.chunks[: last + 1]),
            "OAI-STREAM-10",
        )
    return stream.chunks[: last + 1], stream.chunks[last + 1 :]


def _finish_and_usage(choices: list[dict[str, Any]], extensions: list[dict[str, Any]]) -> None:
    reasons = [chunk["choices"][0].get("finish_reason") for chunk in choices]
    if reasons[-1] not in FINISH_REASONS or any(r is not None for r in reasons[:-1]):
        raise StreamFramingViolation(
            "finish_reason null on every chunk but the last choice chunk, which has one",
            _cut(reasons),
            "OAI-STREAM-05",
        )
    if not isinstance(choices[-1].get("usage"), dict):
        raise StreamFramingViolation(
            "`usage` on the final choice chunk", _cut(choices[-1]), "OAI-STREAM-05"
        )
    usage_chunks = [c for c in extensions if isinstance(c.get("usage"), dict)]
    if len(usage_chunks) != 1:
        raise StreamFramingViolation(
            "with include_usage, one chunk with choices: [] and `usage` after the last choice",
            _cut(extensions),
            "OAI-STREAM-05",
        )


@check(
    "OAI-EP-01",
    "OAI-STREAM-01",
    "OAI-STREAM-02",
    "OAI-STREAM-03",
    "OAI-STREAM-04",
    "OAI-STREAM-05",
    "OAI-STREAM-10",
)
def chat_stream_framing(ctx: Context) -> None:
    """`data: {json}` events: role first, content deltas, finish_reason + usage, usage chunk,
    extension chunks with `choices: []`, then `[DONE]`."""
    body = ctx.chat_body(max_tokens=6, stream=True, stream_options={"include_usage": True})
    _, stream = streamed(ctx, "/chat/completions", body)
    choices, extensions = _split(stream, "chat.completion.chunk")
    deltas = [chunk["choices"][0].get("delta") for chunk in choices]
    if not all(isinstance(delta, dict) for delta in deltas):
        raise StreamFramingViolation("`delta` on every choice chunk", _cut(deltas), "OAI-STREAM-03")
    if deltas[0].get("role") != "assistant":
        raise StreamFramingViolation(
            'delta.role "assistant" on the first chunk', _cut(choices[0]), "OAI-STREAM-04"
        )
    texts = [d.get("content") for d in deltas]
    if not all(text is None or isinstance(text, str) for text in texts):
        raise StreamFramingViolation("delta.content strings", _cut(texts), "OAI-STREAM-03")
    _finish_and_usage(choices, extensions)


@check("OAI-EP-02", "OAI-STREAM-01", "OAI-STREAM-02", "OAI-STREAM-10")
def completion_stream_framing(ctx: Context) -> None:
    """A streamed text completion: `text_completion` chunks, finish_reason last, then `[DONE]`."""
    body = ctx.completion_body(stream=True, stream_options={"include_usage": True})
    _, stream = streamed(ctx, "/completions", body)
    choices, extensions = _split(stream, "text_completion")
    texts = [chunk["choices"][0].get("text") for chunk in choices]
    if not all(isinstance(text, str) for text in texts):
        raise StreamFramingViolation("`text` on every choice chunk", _cut(texts), "OAI-STREAM-03")
    _finish_and_usage(choices, extensions)


@check("OAI-HDR-12", "OAI-HDR-13", "OAI-HDR-14", "OAI-HDR-15", "OAI-STREAM-08")
def stream_steering_chunk(ctx: Context) -> None:
    """A stream sends no X-miLLM-Steering header and ends with one `millm_steering` chunk
    (`created: 0`, `choices: []`) right before `[DONE]`."""
    plain = ctx.post("/chat/completions", ctx.chat_body())
    expect_status(plain, 200, "OAI-EP-01")
    if STEERING not in plain.headers:
        raise NotOffered(f"a non-streamed chat completion carries no {STEERING} header")
    response, stream = streamed(ctx, "/chat/completions", ctx.chat_body(stream=True))
    if STEERING in response.headers:
        raise HeaderViolation(
            f"no {STEERING} header before a stream's body",
            response.headers[STEERING],
            "OAI-HDR-12",
        )
    _, extensions = _split(stream, "chat.completion.chunk")
    steering = [chunk for chunk in extensions if "millm_steering" in chunk]
    if len(steering) != 1 or steering[0] is not stream.chunks[-1]:
        raise StreamFramingViolation(
            "exactly one millm_steering chunk, the last before [DONE]",
            _cut(extensions),
            "OAI-HDR-13",
        )
    chunk = steering[0]
    expected_keys = {"id", "object", "created", "model", "choices", "millm_steering"}
    if set(chunk) != expected_keys or chunk["created"] != 0 or chunk["choices"] != []:
        raise StreamFramingViolation(
            '{"id", "object", "created": 0, "model", "choices": [], "millm_steering"}',
            _cut(chunk),
            "OAI-HDR-15",
        )
    value = chunk["millm_steering"]
    try:
        parse_steering(value if isinstance(value, str) else repr(value))
    except HeaderGrammarError as exc:
        raise HeaderViolation(
            "millm_steering in the X-miLLM-Steering grammar", f"{value!r}: {exc}", exc.requirement
        ) from None
