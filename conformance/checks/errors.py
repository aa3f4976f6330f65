"""Invalid requests get OpenAI's error shape, `param` naming the field (REQ-000 ERR-01, CHAT).

Since contract 0.4.0 a body is read as strict JSON (I-JSON, RFC 7493) before
any other work: nesting past 64 levels and a name given twice are
`invalid_json`, a value no client could have meant (a lone surrogate escape,
NaN, a number past int64 or binary64) is `invalid_parameter` naming it. The
kit writes those bodies by hand, since `json.dumps` would not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..context import PROMPT, Context
from ..failures import ErrorCodeMismatch, StatusMismatch
from ..registry import check
from ..responses import api_error, expect_error, expect_status, shown

RAW = "@@conformance-kit-raw@@"  # a value `_raw` replaces with JSON text written by hand
DEPTH = 2000  # arrays nested in `stop`: far past the contract's 64 levels


def _without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


@check("OAI-ERR-01", "OAI-CHAT-03", "OAI-CHAT-04", "OAI-CHAT-06")
def invalid_request_error_shape(ctx: Context) -> None:
    """An unknown role, a temperature of 5 and a missing `messages` are 400s naming the field."""
    cases = [
        (
            ctx.chat_body(messages=[{"role": "wizard", "content": "hi"}]),
            "messages[0].role",
            "OAI-CHAT-04",
        ),
        (ctx.chat_body(temperature=5), "temperature", "OAI-CHAT-06"),
        (_without(ctx.chat_body(), "messages"), "messages", "OAI-CHAT-03"),
    ]
    for body, param, requirement in cases:
        response = ctx.post("/chat/completions", body)
        if response.status_code != 400:
            raise StatusMismatch(f"HTTP 400 for an invalid `{param}`", shown(response), requirement)
        error = api_error(response)
        if error.param != param:
            raise ErrorCodeMismatch(
                f"`param` {param!r}", f"`param` {error.param!r} in {shown(response)}", "OAI-ERR-01"
            )


@check("OAI-ERR-03", "OAI-CHAT-02")
def unknown_model_not_found(ctx: Context) -> None:
    """A chat request naming a model the server does not know is `404 model_not_found`."""
    body = ctx.chat_body(model="conformance-kit/no-such-model")
    error = expect_error(ctx.post("/chat/completions", body), 404, "model_not_found", "OAI-ERR-03")
    if error.param not in (None, "model"):
        raise ErrorCodeMismatch(
            '`param` "model" (or null)', f"`param` {error.param!r}", "OAI-ERR-03"
        )


@check("OAI-CHAT-10", "OAI-ERR-01")
def streamed_n_refused(ctx: Context) -> None:
    """`n` above 1 with `stream: true` is refused with a 400 in OpenAI's shape."""
    body = ctx.chat_body(messages=PROMPT, n=2, stream=True)
    expect_error(ctx.post("/chat/completions", body), 400, None, "OAI-CHAT-10")


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A hand-written body and the 400 the contract gives it."""

    what: str  # what is wrong with the body, for the report
    body: bytes
    code: str
    param: str
    requirement: str


def _raw(body: dict[str, Any], literal: str) -> bytes:
    """`body` as JSON text, its one `RAW` value replaced by `literal` as it is written."""
    return json.dumps(body).replace(json.dumps(RAW), literal).encode()


def _said(ctx: Context, content: str) -> dict[str, Any]:
    return ctx.chat_body(messages=[{"role": "user", "content": content}])


def _expect_refused(ctx: Context, case: _Refusal) -> None:
    response = ctx.post_raw("/chat/completions", case.body)
    expected = f"400 {case.code} naming `{case.param}` for {case.what}"
    if response.status_code != 400:
        raise StatusMismatch(expected, shown(response), case.requirement)
    error = api_error(response)
    if (error.code, error.param) != (case.code, case.param):
        received = f"`code` {error.code!r}, `param` {error.param!r} ({error.message})"
        raise ErrorCodeMismatch(expected, received, case.requirement)


@check("OAI-ERR-01", "OAI-VALID-01")
def strict_json_bodies(ctx: Context) -> None:
    """A member named twice (`max_tokens`) is `400 invalid_json` naming it, and 2,000 nested
    arrays are `400 invalid_json` naming `body`: no value is dropped silently, nesting is no 500."""
    cases = [
        _Refusal(
            "`max_tokens` given twice",
            _raw(ctx.chat_body(max_tokens=RAW), '4, "max_tokens": 1'),
            "invalid_json",
            "max_tokens",
            "OAI-VALID-01",
        ),
        _Refusal(
            f"{DEPTH:,} nested arrays",
            _raw(ctx.chat_body(stop=RAW), "[" * DEPTH + "]" * DEPTH),
            "invalid_json",
            "body",
            "OAI-ERR-01",
        ),
    ]
    for case in cases:
        _expect_refused(ctx, case)


@check("OAI-ERR-01", "OAI-GEN-02", "OAI-CHAT-06")
def unrepresentable_values_refused(ctx: Context) -> None:
    """A lone surrogate escape in `messages[0].content`, `temperature` NaN or 1e400 and a
    `max_tokens` past int64 are `400 invalid_parameter` naming the value; a surrogate pair (an
    emoji as `ensure_ascii` writes it) is served."""
    cases = [
        _Refusal(
            "a lone surrogate escape (\\ud800)",
            _raw(_said(ctx, RAW), '"Say hello \\ud800."'),
            "invalid_parameter",
            "messages[0].content",
            "OAI-ERR-01",
        ),
        _Refusal(
            "`temperature: NaN`",
            _raw(ctx.chat_body(temperature=RAW), "NaN"),
            "invalid_parameter",
            "temperature",
            "OAI-CHAT-06",
        ),
        _Refusal(
            "`temperature: 1e400`",
            _raw(ctx.chat_body(temperature=RAW), "1e400"),
            "invalid_parameter",
            "temperature",
            "OAI-CHAT-06",
        ),
        _Refusal(
            "`max_tokens: 2**64`",
            _raw(ctx.chat_body(max_tokens=RAW), str(2**64)),
            "invalid_parameter",
            "max_tokens",
            "OAI-ERR-01",
        ),
    ]
    for case in cases:
        _expect_refused(ctx, case)
    pair = _raw(_said(ctx, RAW), '"Say hello \\ud83d\\ude00."')
    expect_status(ctx.post_raw("/chat/completions", pair), 200, "OAI-GEN-02")
