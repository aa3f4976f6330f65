"""Streams: SSE framing, chunk order, usage and `[DONE]` (REQ-000 STREAM, HDR-12..15).

Every chunk of a stream shares one `id`, `created`, `model` and
`system_fingerprint`. A chat stream with `stream_options.include_usage` must
be: a first chunk with `delta.role`, content chunks, one last choice chunk
with `finish_reason`, then extension chunks with `choices: []`, the last of
which carries the request's `usage` (and, on a miLLM server, `millm_steering`),
then `data: [DONE]`; `usage` is null on every other chunk, so a client that
adds up every usage it sees counts the request once. Without include_usage,
a miLLM server puts `usage` on the finish chunk instead (OAI-STREAM-05).
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
ENVELOPE = ("id", "created", "model", "system_fingerprint")
STEERING_CHUNK_KEYS = frozenset(
    {"id", "object", "created", "model", "system_fingerprint", "choices", "millm_steering"}
)


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


def _same_envelope(stream: Stream, requirement: str = "OAI-STREAM-03") -> None:
    """Every chunk of one stream says the same id, created, model and system_fingerprint."""
    for key in ENVELOPE:
        values = {repr(chunk.get(key)) for chunk in stream.chunks}
        if len(values) != 1:
            raise StreamFramingViolation(
                f"one `{key}` on every chunk of a stream", _cut(sorted(values)), requirement
            )


def _usage_at(chunks: list[dict[str, Any]]) -> list[int]:
    """Where the chunks carry a non-null `usage`."""
    return [i for i, chunk in enumerate(chunks) if chunk.get("usage") is not None]


def _finish_and_usage(stream: Stream, choices: list[dict[str, Any]]) -> None:
    """finish_reason on the last choice chunk only; with include_usage, `usage` on exactly one
    chunk, the last, which has `choices: []` (a client that adds every usage it sees counts
    the request once), and null (or absent) on every other."""
    reasons = [chunk["choices"][0].get("finish_reason") for chunk in choices]
    if reasons[-1] not in FINISH_REASONS or any(r is not None for r in reasons[:-1]):
        raise StreamFramingViolation(
            "finish_reason null on every chunk but the last choice chunk, which has one",
            _cut(reasons),
            "OAI-STREAM-05",
        )
    at, last = _usage_at(stream.chunks), stream.chunks[-1]
    if (
        at != [len(stream.chunks) - 1]
        or last["choices"] != []
        or not isinstance(last["usage"], dict)
    ):
        raise StreamFramingViolation(
            "with include_usage, a `usage` object on exactly one chunk: the last before "
            "[DONE], with choices: []",
            f"usage on chunks {at} of {len(stream.chunks)}; last: {_cut(last)}",
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
    """`data: {json}` events of one id, created, model and fingerprint: role first, content
    deltas, finish_reason, then chunks with `choices: []`, the last with `usage`, then `[DONE]`."""
    body = ctx.chat_body(max_tokens=6, stream=True, stream_options={"include_usage": True})
    _, stream = streamed(ctx, "/chat/completions", body)
    choices, _ = _split(stream, "chat.completion.chunk")
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
    _same_envelope(stream)
    _finish_and_usage(stream, choices)


@check("OAI-EP-02", "OAI-STREAM-01", "OAI-STREAM-02", "OAI-STREAM-05", "OAI-STREAM-10")
def completion_stream_framing(ctx: Context) -> None:
    """A streamed text completion: `text_completion` chunks of one envelope, finish_reason
    last, `usage` once on the last chunk, then `[DONE]`."""
    body = ctx.completion_body(stream=True, stream_options={"include_usage": True})
    _, stream = streamed(ctx, "/completions", body)
    choices, _ = _split(stream, "text_completion")
    texts = [chunk["choices"][0].get("text") for chunk in choices]
    if not all(isinstance(text, str) for text in texts):
        raise StreamFramingViolation("`text` on every choice chunk", _cut(texts), "OAI-STREAM-03")
    _same_envelope(stream)
    _finish_and_usage(stream, choices)


@check("OAI-HDR-12", "OAI-HDR-13", "OAI-HDR-14", "OAI-HDR-15", "OAI-STREAM-05", "OAI-STREAM-08")
def stream_steering_chunk(ctx: Context) -> None:
    """A stream sends no X-miLLM-Steering header and ends with one `millm_steering` chunk,
    `choices: []`, right before `[DONE]`, sharing the stream's id, created, model and
    fingerprint; without include_usage, `usage` rides on the finish chunk and no other."""
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
    choices, extensions = _split(stream, "chat.completion.chunk")
    steering = [chunk for chunk in extensions if "millm_steering" in chunk]
    if len(steering) != 1 or steering[0] is not stream.chunks[-1]:
        raise StreamFramingViolation(
            "exactly one millm_steering chunk, the last before [DONE]",
            _cut(extensions),
            "OAI-HDR-13",
        )
    _same_envelope(stream, "OAI-HDR-15")  # created too: issue 15 supersedes HDR-15's 0
    chunk = steering[0]
    if set(chunk) - {"usage"} != STEERING_CHUNK_KEYS or chunk["choices"]:
        raise StreamFramingViolation(
            '{"id", "object", "created", "model", "system_fingerprint", "choices": [], '
            '"millm_steering"}',
            _cut(chunk),
            "OAI-HDR-15",
        )
    if _usage_at(stream.chunks) != [len(choices) - 1]:
        raise StreamFramingViolation(
            "without include_usage, `usage` on the finish chunk and on no other",
            _cut([c.get("usage") for c in stream.chunks]),
            "OAI-STREAM-05",
        )
    value = chunk["millm_steering"]
    try:
        parse_steering(value if isinstance(value, str) else repr(value))
    except HeaderGrammarError as exc:
        raise HeaderViolation(
            "millm_steering in the X-miLLM-Steering grammar", f"{value!r}: {exc}", exc.requirement
        ) from None
