"""Reading responses the way every check does: a JSON object, OpenAI's error, a status.

Each helper raises the typed failure that says what was expected, so a check
reads as a list of expectations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from .failures import BodyShapeViolation, ErrorCodeMismatch, ErrorShapeViolation, StatusMismatch

ERROR_FIELDS = ("message", "type", "param", "code")


def shown(response: httpx.Response, limit: int = 300) -> str:
    """`400 {"error": ...}`, the body cut to `limit` characters."""
    text = response.text
    cut = text if len(text) <= limit else text[:limit] + "..."
    return f"{response.status_code} {cut}"


def expect_status(response: httpx.Response, status: int, requirement: str | None = None) -> None:
    if response.status_code != status:
        raise StatusMismatch(f"HTTP {status}", shown(response), requirement)


def json_object(response: httpx.Response, requirement: str | None = None) -> dict[str, Any]:
    """The body as a JSON object, or a BodyShapeViolation."""
    try:
        body = response.json()
    except ValueError:
        raise BodyShapeViolation("a JSON object", shown(response), requirement) from None
    if not isinstance(body, dict):
        raise BodyShapeViolation("a JSON object", shown(response), requirement)
    return body


@dataclass(frozen=True, slots=True)
class ApiError:
    """The `error` object of an OpenAI-format error body."""

    status: int
    message: str
    type: str
    param: str | None
    code: str | None

    def names(self, text: str) -> bool:
        """Whether `param` or the message names `text` (case-insensitively)."""
        needle = text.lower()
        return (self.param or "").lower() == needle or needle in self.message.lower()


def api_error(response: httpx.Response, requirement: str = "OAI-ERR-01") -> ApiError:
    """The response as a 4xx/5xx with `{"error": {message, type, param, code}}`, or a failure."""
    if response.status_code < 400:
        raise StatusMismatch("an error status (4xx)", shown(response), requirement)
    expected = '{"error": {"message": str, "type": str, "param": str|null, "code": str|null}}'
    try:
        body = response.json()
    except ValueError:
        raise ErrorShapeViolation(expected, shown(response), requirement) from None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or any(key not in error for key in ERROR_FIELDS):
        raise ErrorShapeViolation(expected, shown(response), requirement)
    message, kind, param, code = (error[key] for key in ERROR_FIELDS)
    if not isinstance(message, str) or not isinstance(kind, str):
        raise ErrorShapeViolation(expected, shown(response), requirement)
    if not (param is None or isinstance(param, str)) or not (code is None or isinstance(code, str)):
        raise ErrorShapeViolation(expected, shown(response), requirement)
    return ApiError(response.status_code, message, kind, param, code)


def expect_error(
    response: httpx.Response, status: int, code: str | None, requirement: str
) -> ApiError:
    """OpenAI's error shape with this status and (unless None) this code."""
    error = api_error(response)
    if error.status != status:
        raise StatusMismatch(f"HTTP {status} ({code or 'an error'})", shown(response), requirement)
    if code is not None and error.code != code:
        raise ErrorCodeMismatch(
            f"`code` {code!r}", f"`code` {error.code!r} ({error.message})", requirement
        )
    return error


def field(body: dict[str, Any], path: str, requirement: str | None = None) -> Any:
    """`body["a"]["b"][0]` for `path` "a.b.0", or a BodyShapeViolation naming the path."""
    value: Any = body
    for part in path.split("."):
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, TypeError, ValueError):
            raise BodyShapeViolation(
                f"`{path}` in the body", _cut(repr(body)), requirement
            ) from None
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
