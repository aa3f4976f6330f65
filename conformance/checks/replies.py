"""Non-streamed chat and text completions (REQ-000 RESP, CMPL, SEED-14)."""

from __future__ import annotations

import re
from typing import Any

from ..context import Context
from ..failures import BodyShapeViolation
from ..registry import check
from ..responses import expect_status, field, is_int, json_object

FINGERPRINT = re.compile(r"^millm:.+@[^@:/]+:[^:/]+/[^:/]+:[^:/@]+$")
MAX_TOKENS = 2
LONG_ANSWER = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, repr(received)[:300], requirement)


def _usage(body: dict[str, Any], requirement: str) -> dict[str, Any]:
    usage: Any = field(body, "usage", requirement)
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    counts: list[Any] = [usage.get(k) for k in keys] if isinstance(usage, dict) else []
    _expect(
        len(counts) == 3
        and all(is_int(c) and c >= 0 for c in counts)
        and counts[0] + counts[1] == counts[2],
        "usage {prompt_tokens, completion_tokens, total_tokens = prompt + completion}",
        usage,
        requirement,
    )
    result: dict[str, Any] = usage
    return result


def _finish(choice: dict[str, Any], completion_tokens: int, requirement: str) -> None:
    """`length` when max_tokens was reached, `stop` when generation ended before it."""
    reason = choice.get("finish_reason")
    if completion_tokens >= MAX_TOKENS:
        _expect(
            reason == "length",
            f'finish_reason "length" at max_tokens {MAX_TOKENS}',
            choice,
            requirement,
        )
    else:
        _expect(reason == "stop", 'finish_reason "stop" before max_tokens', choice, requirement)


def _fingerprint(body: dict[str, Any], requirement: str) -> None:
    value = body.get("system_fingerprint")
    _expect(
        isinstance(value, str) and bool(FINGERPRINT.match(value)),
        "system_fingerprint millm:<model>@<revision>:<dtype>/<quantization>:<engine>",
        value,
        requirement,
    )


@check(
    "OAI-EP-01",
    "OAI-RESP-01",
    "OAI-RESP-02",
    "OAI-RESP-03",
    "OAI-RESP-04",
    "OAI-RESP-05",
    "OAI-RESP-07",
    "OAI-RESP-10",
    "OAI-RESP-11",
    "OAI-SEED-14",
)
def chat_completion_shape(ctx: Context) -> None:
    """A chat completion has the documented id, object, created, choices, usage and fingerprint."""
    response = ctx.post(
        "/chat/completions", ctx.chat_body(messages=LONG_ANSWER, max_tokens=MAX_TOKENS)
    )
    expect_status(response, 200, "OAI-EP-01")
    body = json_object(response, "OAI-EP-01")
    _expect(
        str(body.get("id", "")).startswith("chatcmpl-"),
        "id chatcmpl-...",
        body.get("id"),
        "OAI-RESP-01",
    )
    _expect(
        body.get("object") == "chat.completion",
        'object "chat.completion"',
        body.get("object"),
        "OAI-RESP-02",
    )
    _expect(
        is_int(body.get("created")),
        "created as integer Unix seconds",
        body.get("created"),
        "OAI-RESP-03",
    )
    _expect(
        isinstance(body.get("model"), str) and body["model"],
        "the model's name",
        body.get("model"),
        "OAI-RESP-04",
    )
    choices = field(body, "choices", "OAI-RESP-05")
    _expect(isinstance(choices, list) and len(choices) == 1, "one choice", choices, "OAI-RESP-05")
    choice = choices[0]
    message = field(choice, "message", "OAI-RESP-05")
    _expect(
        choice.get("index") == 0
        and isinstance(message, dict)
        and message.get("role") == "assistant"
        and "content" in message
        and (message["content"] is None or isinstance(message["content"], str)),
        'choices[0] {index: 0, message: {role: "assistant", content}, finish_reason}',
        choice,
        "OAI-RESP-05",
    )
    usage = _usage(body, "OAI-RESP-07")
    _finish(choice, usage["completion_tokens"], "OAI-RESP-10")
    _fingerprint(body, "OAI-RESP-11")


@check("OAI-EP-02", "OAI-CMPL-01", "OAI-CMPL-02", "OAI-CMPL-06")
def text_completion_shape(ctx: Context) -> None:
    """A text completion answers one choice per prompt, as OpenAI's `text_completion`."""
    for prompts in ("Once upon a time", ["Once upon a time", "In a galaxy far away"]):
        response = ctx.post(
            "/completions", ctx.completion_body(prompt=prompts, max_tokens=MAX_TOKENS)
        )
        expect_status(response, 200, "OAI-EP-02")
        body = json_object(response, "OAI-EP-02")
        _expect(
            str(body.get("id", "")).startswith("cmpl-") and body.get("object") == "text_completion",
            'id cmpl-... and object "text_completion"',
            body,
            "OAI-EP-02",
        )
        count = 1 if isinstance(prompts, str) else len(prompts)
        choices = field(body, "choices", "OAI-CMPL-01")
        requirement = "OAI-CMPL-01" if count == 1 else "OAI-CMPL-02"
        _expect(
            isinstance(choices, list)
            and [c.get("index") for c in choices if isinstance(c, dict)] == list(range(count))
            and all(isinstance(c.get("text"), str) for c in choices),
            f"{count} choice(s) with index 0..{count - 1} and text",
            choices,
            requirement,
        )
        _usage(body, "OAI-EP-02")
        _fingerprint(body, "OAI-CMPL-06")
