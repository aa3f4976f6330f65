"""Invalid requests get OpenAI's error shape, `param` naming the field (REQ-000 ERR-01, CHAT)."""

from __future__ import annotations

from typing import Any

from ..context import PROMPT, Context
from ..failures import ErrorCodeMismatch, StatusMismatch
from ..registry import check
from ..responses import api_error, expect_error, shown


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
