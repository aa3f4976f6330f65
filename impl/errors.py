"""One error hierarchy, mapped to OpenAI's wire format in one place.

    ApiError(code, message, param)        any refusal; status and type come
      |                                   from spec/policy/errors.yaml
      +-- FieldNotHonoured(param)         400 field_not_honoured
      +-- InvalidParameter(param, msg)    400 invalid_parameter

Every error body, on every route, is
`{"error": {"message", "type", "param", "code"}}`. A 500 never carries a stack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .engines.memory import ran_out


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    status: int
    type: str


@cache
def catalog() -> Mapping[str, CatalogEntry]:
    """The error catalog from spec/policy/errors.yaml."""
    text = (resources.files("miserver.spec") / "policy" / "errors.yaml").read_text("utf-8")
    raw: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return {code: CatalogEntry(int(v["status"]), str(v["type"])) for code, v in raw.items()}


class ApiError(Exception):
    """A refusal with a catalog code, a message and the field it concerns."""

    def __init__(
        self,
        code: str,
        message: str,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if code not in catalog():
            raise KeyError(f"error code {code!r} is not in spec/policy/errors.yaml")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    @property
    def status(self) -> int:
        return catalog()[self.code].status

    @property
    def type(self) -> str:
        return catalog()[self.code].type

    def body(self) -> dict[str, Any]:
        """The OpenAI-format error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode("utf-8")


class InvalidParameter(ApiError):
    """400 invalid_parameter naming the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__("invalid_parameter", message, param)


class FieldNotHonoured(ApiError):
    """400 field_not_honoured: an output-changing field this path cannot honour."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__("field_not_honoured", f"`{param}` is not honoured {reason}.", param)


def internal_error() -> ApiError:
    """The only body a server fault gets: no stack, no exception text."""
    return ApiError("internal_error", "The server failed to handle this request.")


def fault(exc: BaseException) -> ApiError:
    """The answer to a failure no handler expected: `exc` itself when it is a refusal,
    `503 insufficient_memory` naming the card when a pass ran it out of memory (OAI-ERR-28,
    OAI-SCORE-31), else `internal_error`."""
    if isinstance(exc, ApiError):
        return exc
    card = ran_out(exc)
    if card is not None:
        return ApiError(
            "insufficient_memory",
            f"The request ran {card} out of memory; retry with a shorter prompt or fewer "
            "tokens, or when fewer requests run.",
        )
    return internal_error()


@cache
def _anthropic() -> tuple[Mapping[int, int], Mapping[int, str]]:
    """Anthropic's statuses and error types on the Messages routes, from
    spec/policy/anthropic_errors.yaml."""
    text = (resources.files("miserver.spec") / "policy" / "anthropic_errors.yaml").read_text(
        "utf-8"
    )
    raw: dict[str, dict[int, Any]] = yaml.safe_load(text)
    statuses = {int(k): int(v) for k, v in raw["statuses"].items()}
    return statuses, {int(k): str(v) for k, v in raw["types"].items()}


def anthropic_status(status: int) -> int:
    """The status an error has on the Messages routes (a 503 is Anthropic's 529)."""
    return _anthropic()[0].get(status, status)


def anthropic_type(status: int) -> str:
    """Anthropic's error type of a (Messages-route) status: a 4xx not listed is an invalid
    request, a 5xx not listed the API's own error."""
    listed = _anthropic()[1]
    return listed.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error(error: Mapping[str, Any], status: int) -> dict[str, Any]:
    """An OpenAI-format `error` object as Anthropic's, with its catalog `code` and
    `param` kept (miserver's members, as on every route)."""
    return {
        "type": anthropic_type(anthropic_status(status)),
        "message": error.get("message", ""),
        "code": error.get("code"),
        "param": error.get("param"),
    }
