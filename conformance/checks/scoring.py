"""Scoring mode and token log-probabilities (REQ-000 SCORE, CSCORE; contract 0.17.0).

A request that asks for logprobs with `max_tokens: 1` scores the next token;
with any other `max_tokens` it generates and reports each generated token
(contract 0.17.0 supersedes OAI-SCORE-32's 400); `echo` puts the prompt's
tokens first, the first with a `null` log-probability. A server that refuses
a field as not honoured (`400 field_not_honoured`) does not offer it: "not
offered".
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from ..context import Context
from ..failures import BodyShapeViolation, HeaderViolation, NotOffered
from ..registry import check
from ..responses import api_error, expect_error, expect_status, field, is_int, json_object

PROMPT = "The capital of France is"
TOP = 3
GENERATED = 3  # max_tokens of the generations with logprobs
ALTERNATIVES = 2  # top_logprobs of the chat generation


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, repr(received)[:400], requirement)


def _scored(ctx: Context, path: str, body: dict[str, Any], field_name: str) -> dict[str, Any]:
    """The 200 body of a scoring request, or NotOffered when the server refuses the field."""
    response = _answered(ctx, path, body, field_name, "OAI-SCORE-01")
    _unsteered(response)
    return json_object(response, "OAI-SCORE-01")


def _answered(
    ctx: Context, path: str, body: dict[str, Any], field_name: str, requirement: str
) -> httpx.Response:
    """A 200 to `body`, or NotOffered when the server refuses `field_name` as not honoured."""
    response = ctx.post(path, body)
    if response.status_code == 400:
        error = api_error(response)
        if error.code == "field_not_honoured":
            raise NotOffered(f"`{error.param or field_name}` on {path} is refused: {error.message}")
    expect_status(response, 200, requirement)
    return response


def _unsteered(response: httpx.Response) -> None:
    value = response.headers.get("X-miLLM-Steering")
    if value is not None and value != "none":
        raise HeaderViolation("X-miLLM-Steering: none on scoring", value, "OAI-HDR-11")


def _chat_entry(entry: Any, alternatives: int, requirement: str) -> list[Any]:
    """A chat `logprobs.content` entry `{token, logprob, bytes, top_logprobs}` (its shape
    under `requirement`) with exactly `alternatives` entries of `{token, logprob, bytes}`
    (OAI-CSCORE-18); its `top_logprobs`."""
    _expect(
        _token_entry(entry) and isinstance(entry.get("top_logprobs"), list),
        "{token, logprob, bytes (UTF-8 of token), top_logprobs}",
        entry,
        requirement,
    )
    top: list[Any] = entry["top_logprobs"]
    _expect(
        len(top) == alternatives and all(_token_entry(t) for t in top),
        f"top_logprobs: {alternatives} entries of {{token, logprob, bytes}}",
        top,
        "OAI-CSCORE-18",
    )
    return top


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
    _chat_entry(entry, TOP, "OAI-CSCORE-14")
    _expect(
        message["content"] == entry["token"],
        "message content = the scored token",
        (message, entry["token"]),
        "OAI-CSCORE-13",
    )


def _generated_count(body: dict[str, Any], requirement: str) -> int:
    """`usage.completion_tokens`: how many tokens the logprobs must cover."""
    tokens = field(body, "usage.completion_tokens", requirement)
    _expect(is_int(tokens) and tokens >= 1, "usage.completion_tokens >= 1", tokens, requirement)
    count: int = tokens
    return count


def _covers(entries: int, generated: int, choice: dict[str, Any], requirement: str) -> None:
    """One entry per generated token: as many as `completion_tokens`, or one fewer where the
    choice stopped before `max_tokens` (an end-of-generation token that a server counts has
    no entry)."""
    stopped = choice.get("finish_reason") != "length"
    _expect(
        entries == generated or (stopped and entries == generated - 1 and entries >= 1),
        f"one logprobs entry per generated token ({generated})",
        choice.get("logprobs"),
        requirement,
    )


def _legacy(
    choice: dict[str, Any], start: int, top: int, requirement: str
) -> tuple[list[str], list[Any], list[Any]]:
    """A choice's legacy `logprobs`: four arrays of one length whose tokens spell the text and
    whose offsets count from `start` by each token's text; (tokens, token_logprobs,
    top_logprobs)."""
    logprobs = field(choice, "logprobs", requirement)
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    arrays: list[Any] = [logprobs.get(k) for k in keys] if isinstance(logprobs, dict) else []
    _expect(
        len(arrays) == 4
        and all(isinstance(a, list) for a in arrays)
        and len({len(a) for a in arrays}) == 1,
        "logprobs {tokens, token_logprobs, top_logprobs, text_offset}, arrays of one length",
        logprobs,
        requirement,
    )
    tokens: list[str] = arrays[0]
    values: list[Any] = arrays[1]
    tops: list[Any] = arrays[2]
    offsets: list[Any] = arrays[3]
    _expect(
        all(isinstance(t, str) for t in tokens) and "".join(tokens) == choice.get("text"),
        "the tokens spell the choice's text",
        (tokens, choice.get("text")),
        requirement,
    )
    expected = [start + len("".join(tokens[:i])) for i in range(len(tokens))]
    _expect(
        offsets == expected,
        f"text_offset {expected} (each token's offset in prompt + completion)",
        offsets,
        "OAI-SCORE-16",
    )
    for value, alternatives in zip(values, tops, strict=True):
        if value is None and alternatives is None:
            continue  # an echoed first token; the caller says where that is allowed
        _expect(
            _logprob(value)
            and isinstance(alternatives, dict)
            and 1 <= len(alternatives) <= top + 1  # the k best, and the token (OpenAI)
            and all(_logprob(v) for v in alternatives.values()),
            f"a log-probability <= 0 and 1..{top + 1} alternatives keyed by token (the "
            f"{top} best, and the token itself when it is not among them)",
            (value, alternatives),
            requirement,
        )
    return tokens, values, tops


@check("OAI-SCORE-09", "OAI-SCORE-11", "OAI-SCORE-15", "OAI-SCORE-32")
def logprobs_score_or_generate(ctx: Context) -> None:
    """`logprobs` with `max_tokens: 1` scores one token; with `max_tokens: 3` it generates and
    reports each generated token (contract 0.17.0 supersedes OAI-SCORE-32's 400);
    `allowed_token_ids` still needs `max_tokens: 1`.

    A server that refuses `logprobs` on a generation as not honoured does not offer it.
    """
    body = ctx.completion_body(prompt=PROMPT, max_tokens=1, logprobs=1)
    scored = _scored(ctx, "/completions", body, "logprobs")
    choice = field(scored, "choices.0", "OAI-SCORE-15")
    tokens, values, _ = _legacy(choice, len(PROMPT), 1, "OAI-SCORE-15")
    _expect(
        len(tokens) == 1 and values[0] is not None,
        "scoring: exactly one logprobs entry, the scored token's",
        choice.get("logprobs"),
        "OAI-SCORE-11",
    )
    body = ctx.completion_body(prompt=PROMPT, max_tokens=GENERATED, logprobs=1)
    response = _answered(ctx, "/completions", body, "logprobs", "OAI-SCORE-32")
    generated = json_object(response, "OAI-SCORE-32")
    choice = field(generated, "choices.0", "OAI-SCORE-15")
    tokens, values, _ = _legacy(choice, len(PROMPT), 1, "OAI-SCORE-15")
    _expect(
        1 <= len(tokens) <= GENERATED and None not in values,
        f"a generation: 1..{GENERATED} entries, each with its log-probability",
        choice.get("logprobs"),
        "OAI-SCORE-32",
    )
    _covers(len(tokens), _generated_count(generated, "OAI-SCORE-32"), choice, "OAI-SCORE-32")
    body = ctx.completion_body(prompt=PROMPT, max_tokens=GENERATED, allowed_token_ids=[0, 1])
    expect_error(ctx.post("/completions", body), 400, None, "OAI-SCORE-09")


@check("OAI-CSCORE-03", "OAI-CSCORE-14", "OAI-CSCORE-15", "OAI-CSCORE-16", "OAI-CSCORE-18")
def chat_generation_logprobs(ctx: Context) -> None:
    """`logprobs: true, top_logprobs: 2, max_tokens: 3` on chat generates and returns one
    `logprobs.content` entry per generated token in OpenAI's shape.

    Each entry is `{token, logprob, bytes, top_logprobs}` with 2 alternatives sorted most
    probable first, the token as probable as the first (temperature 0: the greedy pick); the
    entries' bytes spell the message. A server that refuses `logprobs` as not honoured does
    not offer it.
    """
    body = ctx.chat_body(max_tokens=GENERATED, logprobs=True, top_logprobs=ALTERNATIVES)
    response = _answered(ctx, "/chat/completions", body, "logprobs", "OAI-CSCORE-14")
    reply = json_object(response, "OAI-CSCORE-14")
    choice = field(reply, "choices.0", "OAI-CSCORE-14")
    content = field(choice, "logprobs.content", "OAI-CSCORE-14")
    _expect(
        isinstance(content, list) and 1 <= len(content) <= GENERATED,
        f"logprobs.content: 1..{GENERATED} entries",
        content,
        "OAI-CSCORE-14",
    )
    _covers(len(content), _generated_count(reply, "OAI-CSCORE-14"), choice, "OAI-CSCORE-14")
    for entry in content:
        top = _chat_entry(entry, ALTERNATIVES, "OAI-CSCORE-16")
        values = [t["logprob"] for t in top]
        _expect(
            values == sorted(values, reverse=True) and entry["logprob"] >= values[0] - 1e-6,
            "top_logprobs most probable first, the greedy token's log-probability the first's",
            entry,
            "OAI-CSCORE-15",
        )
    spelled = b"".join(bytes(entry["bytes"]) for entry in content)
    message = field(choice, "message.content", "OAI-CSCORE-14")
    _expect(
        isinstance(message, str) and spelled == message.encode("utf-8"),
        "the entries' bytes spell the message content",
        (spelled, message),
        "OAI-CSCORE-14",
    )


@check("OAI-SCORE-01", "OAI-SCORE-15", "OAI-SCORE-16")
def completion_echo_logprobs(ctx: Context) -> None:
    """`echo: true, logprobs: 1, max_tokens: 0` (lm-eval's log-likelihood) returns the prompt as
    the text and one logprobs entry per prompt token, the first `null`.

    The first token's `token_logprobs` and `top_logprobs` entries are `null` (nothing predicts
    it), the others numbers; `text_offset` starts at 0; nothing is generated. A server that
    refuses `echo` or `logprobs` as not honoured does not offer it.
    """
    body = ctx.completion_body(prompt=PROMPT, max_tokens=0, logprobs=1, echo=True)
    response = _answered(ctx, "/completions", body, "echo", "OAI-SCORE-01")
    reply = json_object(response, "OAI-SCORE-01")
    choice = field(reply, "choices.0", "OAI-SCORE-15")
    _expect(
        choice.get("text") == PROMPT, f"text {PROMPT!r} (the echoed prompt)", choice, "OAI-SCORE-01"
    )
    tokens, values, tops = _legacy(choice, 0, 1, "OAI-SCORE-15")
    _expect(
        len(tokens) >= 2 and values[0] is None and tops[0] is None,
        "token_logprobs[0] and top_logprobs[0] null (the prompt's first token)",
        choice.get("logprobs"),
        "OAI-SCORE-15",
    )
    _expect(
        None not in values[1:] and None not in tops[1:],
        "every later token with its log-probability and alternatives",
        choice.get("logprobs"),
        "OAI-SCORE-15",
    )
    completion = field(reply, "usage.completion_tokens", "OAI-SCORE-01")
    _expect(
        completion == 0,
        "usage.completion_tokens 0 (max_tokens 0 with echo)",
        completion,
        "OAI-SCORE-01",
    )
