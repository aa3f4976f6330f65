"""Scoring mode: next-token log-probabilities with `max_tokens: 1` (REQ-000 SCORE, CSCORE).

A server that refuses the scoring fields as not honoured (`400
field_not_honoured`, e.g. a GGUF model) does not offer scoring: "not offered".
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from ..context import Context
from ..failures import BodyShapeViolation, HeaderViolation, NotOffered
from ..registry import check
from ..responses import api_error, expect_error, expect_status, field, json_object

PROMPT = "The capital of France is"
TOP = 3


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, repr(received)[:400], requirement)


def _scored(ctx: Context, path: str, body: dict[str, Any], field_name: str) -> dict[str, Any]:
    """The 200 body of a scoring request, or NotOffered when the server refuses the field."""
    response = ctx.post(path, body)
    if response.status_code == 400:
        error = api_error(response)
        if error.code == "field_not_honoured":
            raise NotOffered(f"`{field_name}` on {path} is refused: {error.message}")
    expect_status(response, 200, "OAI-SCORE-01")
    _unsteered(response)
    return json_object(response, "OAI-SCORE-01")


def _unsteered(response: httpx.Response) -> None:
    value = response.headers.get("X-miLLM-Steering")
    if value is not None and value != "none":
        raise HeaderViolation("X-miLLM-Steering: none on scoring", value, "OAI-HDR-11")


def _logprob(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value <= 0.0
        and math.isfinite(value)
    )


@check("OAI-SCORE-01", "OAI-SCORE-02", "OAI-SCORE-12", "OAI-SCORE-15", "OAI-SCORE-16", "OAI-HDR-11")
def completion_scoring_shape(ctx: Context) -> None:
    """`logprobs: 3, max_tokens: 1` on /completions returns OpenAI's logprobs for one token."""
    body = ctx.completion_body(prompt=PROMPT, max_tokens=1, logprobs=TOP)
    scored = _scored(ctx, "/completions", body, "logprobs")
    choice = field(scored, "choices.0", "OAI-SCORE-15")
    logprobs = field(choice, "logprobs", "OAI-SCORE-15")
    _expect(
        isinstance(logprobs, dict)
        and all(
            isinstance(logprobs.get(k), list) and len(logprobs[k]) == 1
            for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        ),
        "logprobs {tokens, token_logprobs, top_logprobs, text_offset}, one entry each",
        logprobs,
        "OAI-SCORE-15",
    )
    token, logprob = logprobs["tokens"][0], logprobs["token_logprobs"][0]
    top = logprobs["top_logprobs"][0]
    _expect(
        isinstance(token, str) and _logprob(logprob),
        "a token and its log-probability <= 0",
        (token, logprob),
        "OAI-SCORE-15",
    )
    _expect(
        isinstance(top, dict) and 1 <= len(top) <= TOP and all(_logprob(v) for v in top.values()),
        f"top_logprobs[0]: 1..{TOP} alternatives keyed by token",
        top,
        "OAI-SCORE-02",
    )
    _expect(
        choice.get("text") == token and token in top,
        "choice text = the scored token, which is among the alternatives",
        choice,
        "OAI-SCORE-12",
    )
    _expect(
        logprobs["text_offset"] == [len(PROMPT)],
        f"text_offset [{len(PROMPT)}]",
        logprobs["text_offset"],
        "OAI-SCORE-16",
    )


def _token_entry(entry: Any) -> bool:
    """{token, logprob, bytes} with bytes the UTF-8 of the token (OAI-CSCORE-15/16)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        return False
    text = entry["token"]
    raw = entry.get("bytes")
    return (
        _logprob(entry.get("logprob"))
        and isinstance(raw, list)
        and (text.startswith("token_id:") or raw == list(text.encode("utf-8")))
    )


@check(
    "OAI-CSCORE-02",
    "OAI-CSCORE-13",
    "OAI-CSCORE-14",
    "OAI-CSCORE-15",
    "OAI-CSCORE-16",
    "OAI-CSCORE-18",
    "OAI-CSCORE-22",
)
def chat_scoring_shape(ctx: Context) -> None:
    """`logprobs: true, top_logprobs: 3, max_tokens: 1` on chat returns one scored token entry."""
    body = ctx.chat_body(max_tokens=1, logprobs=True, top_logprobs=TOP)
    scored = _scored(ctx, "/chat/completions", body, "logprobs")
    choice = field(scored, "choices.0", "OAI-CSCORE-13")
    message = field(choice, "message", "OAI-CSCORE-13")
    _expect(
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and isinstance(message.get("content"), str),
        'message {role: "assistant", content: the scored token}',
        message,
        "OAI-CSCORE-13",
    )
    content = field(choice, "logprobs.content", "OAI-CSCORE-13")
    _expect(
        isinstance(content, list) and len(content) == 1,
        "logprobs.content: one entry",
        content,
        "OAI-CSCORE-14",
    )
    entry = content[0]
    _expect(
        _token_entry(entry) and isinstance(entry.get("top_logprobs"), list),
        "{token, logprob, bytes (UTF-8 of token), top_logprobs}",
        entry,
        "OAI-CSCORE-14",
    )
    top = entry["top_logprobs"]
    _expect(
        len(top) == TOP and all(_token_entry(t) for t in top),
        f"top_logprobs: {TOP} entries of {{token, logprob, bytes}}",
        top,
        "OAI-CSCORE-18",
    )
    _expect(
        message["content"] == entry["token"],
        "message content = the scored token",
        (message, entry["token"]),
        "OAI-CSCORE-13",
    )


@check("OAI-SCORE-09", "OAI-SCORE-32")
def scoring_needs_one_token(ctx: Context) -> None:
    """`logprobs` with `max_tokens` other than 1 is a 400, never text with logprobs dropped."""
    body = ctx.completion_body(prompt=PROMPT, max_tokens=1, logprobs=TOP)
    _scored(ctx, "/completions", body, "logprobs")
    body = ctx.completion_body(prompt=PROMPT, max_tokens=5, logprobs=TOP)
    expect_error(ctx.post("/completions", body), 400, None, "OAI-SCORE-32")
