"""A batch's input lines read one by one, and the JSONL lines of its output and error files.

An input line is OpenAI's `{"custom_id", "method": "POST", "url", "body"}`.
A line that is not that (not JSON, no `custom_id` or one used before, another
method or endpoint, a `body` that is not an object, `stream: true`, a key of
its own) is not run: it becomes an error line, `response` null and `error`
naming the code, the field and the line, and the batch goes on. A line naming
a model this server does not serve by that name gets, at validation, the
refusal the route would answer (OAI-GGUF-08): `response` holds its status and
error body. Blank lines are skipped.

An output line is OpenAI's `{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`, and `response.millm.headers` holds every
`X-miLLM-*` header of the answer by its lower-case name (OAI-HDR-17; REQ-000
open point 2): the steering statement, the probe verdicts, the seed.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ApiError, InvalidParameter
from ...store.batches import LineRecord, Tokens

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_LINES = 50_000  # OpenAI's limit on a batch's requests
KEYS = frozenset({"custom_id", "method", "url", "body"})
MILLM = "x-millm-"

Refusal = Callable[[str], ApiError | None]  # a model name -> the route's refusal, if any


@dataclass(frozen=True, slots=True)
class Answer:
    """A route's answer to a line: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Ended:
    """A line's end as its file keeps it: the JSONL line, whether it failed, its tokens."""

    result: str
    failed: bool
    tokens: Tokens = field(default_factory=Tokens)


class _Refused(Exception):
    def __init__(self, code: str, param: str | None, message: str) -> None:
        super().__init__(message)
        self.code, self.param, self.message = code, param, message


def read(content: bytes, endpoint: str, refusal: Refusal) -> list[LineRecord]:
    """Every non-blank line of an input file, each to run or refused; 400 naming
    `input_file_id` when the file is not UTF-8, holds no line or holds too many."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameter(
            "input_file_id", f"The input file is not UTF-8 text (byte {exc.start})."
        ) from None
    seen: set[str] = set()
    lines = [
        _line(number, raw, endpoint, seen, refusal)
        for number, raw in enumerate(text.split("\n"), start=1)
        if raw.strip()
    ]
    if not lines:
        raise InvalidParameter("input_file_id", "The input file holds no request line.")
    if len(lines) > MAX_LINES:
        raise InvalidParameter(
            "input_file_id",
            f"The input file holds {len(lines)} request lines; a batch takes at most {MAX_LINES}.",
        )
    return lines


def _line(number: int, raw: str, endpoint: str, seen: set[str], refusal: Refusal) -> LineRecord:
    custom_id: str | None = None
    try:
        item = _object(raw)
        custom_id = _custom_id(item, seen)
        body = _request(item, endpoint)
    except _Refused as refused:
        return LineRecord(number, custom_id, None, failed_line(custom_id, number, refused), True)
    model = body.get("model")
    route_refusal = refusal(model) if isinstance(model, str) else None
    if route_refusal is not None:
        ended = answered(custom_id, _refused_answer(route_refusal))
        return LineRecord(number, custom_id, None, ended.result, True)
    return LineRecord(number, custom_id, json.dumps(body, ensure_ascii=False))


def _object(raw: str) -> dict[str, Any]:
    try:
        item = json.loads(raw)
    except ValueError as exc:
        raise _Refused("invalid_json", None, f"The line is not JSON: {exc}.") from None
    if not isinstance(item, dict):
        raise _Refused("invalid_request", None, "The line is not a JSON object.")
    extra = sorted(set(item) - KEYS)
    if extra:
        raise _Refused(
            "invalid_request",
            extra[0],
            f"A line holds `custom_id`, `method`, `url` and `body`, not {', '.join(extra)}.",
        )
    return item


def _custom_id(item: Mapping[str, Any], seen: set[str]) -> str:
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Refused("invalid_request", "custom_id", "The line needs a `custom_id` string.")
    if custom_id in seen:
        raise _Refused(
            "duplicate_custom_id",
            "custom_id",
            f"The `custom_id` {custom_id!r} is used by an earlier line.",
        )
    seen.add(custom_id)
    return custom_id


def _request(item: Mapping[str, Any], endpoint: str) -> dict[str, Any]:
    if item.get("method") != "POST":
        raise _Refused("invalid_request", "method", "A batch line's `method` is `POST`.")
    if item.get("url") != endpoint:
        raise _Refused(
            "invalid_request",
            "url",
            f"The line's `url` is {item.get('url')!r}; this batch's endpoint is {endpoint}.",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        raise _Refused("invalid_request", "body", "The line's `body` is not a JSON object.")
    if body.get("stream") is True:
        raise _Refused(
            "invalid_request", "body.stream", "A batch line is answered whole: no `stream`."
        )
    return body


def _refused_answer(error: ApiError) -> Answer:
    headers = {name.lower(): value for name, value in error.headers.items()}
    return Answer(error.status, headers, error.body_bytes())


def line_id() -> str:
    """An output line's id, OpenAI's shape (`batch_req_` and 24 hex digits)."""
    return f"batch_req_{secrets.token_hex(12)}"


def failed_line(custom_id: str | None, number: int, refused: _Refused) -> str:
    """An error line for a line not run: `response` null, `error` naming code, field, line."""
    error = {"code": refused.code, "message": refused.message, "param": refused.param}
    return _dump(
        {
            "id": line_id(),
            "custom_id": custom_id,
            "response": None,
            "error": error | {"line": number},
        }
    )


def unrun(custom_id: str | None, number: int, code: str, message: str) -> str:
    """An error line for a line its batch never ran (`batch_cancelled`, `batch_expired`)."""
    return failed_line(custom_id, number, _Refused(code, None, message))


def answered(custom_id: str | None, answer: Answer) -> Ended:
    """The output (2xx) or error line for a line the route answered."""
    body: Any
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = answer.body.decode("utf-8", "replace")
    headers = {name: value for name, value in answer.headers.items() if name.startswith(MILLM)}
    response = {
        "status_code": answer.status,
        "request_id": answer.headers.get("x-request-id"),
        "body": body,
        "millm": {"headers": headers},
    }
    line = {"id": line_id(), "custom_id": custom_id, "response": response, "error": None}
    failed = not 200 <= answer.status < 300
    return Ended(_dump(line), failed, Tokens() if failed else _tokens(body))


def _tokens(body: Any) -> Tokens:
    """A 2xx body's token counts: chat and text completions' and embeddings' `usage`, or the
    Responses API's."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Tokens()
    given = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    made = usage.get("output_tokens", usage.get("completion_tokens", 0))
    ins = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    outs = usage.get("output_tokens_details") or usage.get("completion_tokens_details") or {}
    return Tokens(
        input=int(given or 0),
        output=int(made or 0),
        cached=int(ins.get("cached_tokens") or 0),
        reasoning=int(outs.get("reasoning_tokens") or 0),
    )


def _dump(line: Mapping[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))
