"""Request-body validation against spec/openapi, reported the OpenAI way.

Connexion's JSON body validator raises RFC 7807 problems; this one raises
ApiError with `param` as the failing field's path (`messages[0].role`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from connexion.validators import JSONRequestBodyValidator, ParameterValidator
from jsonschema.exceptions import ValidationError, best_match

from .errors import ApiError, InvalidParameter

MAX_SHOWN = 120


def location(parts: Iterable[str | int]) -> str:
    """`['messages', 0, 'role']` -> `messages[0].role`."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(error: ValidationError) -> tuple[str, str]:
    """(param, message) for one schema violation."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = next(p for p in error.validator_value if p not in error.instance)
        param = location([*path, missing])
        return param, f"`{param}` is required."
    param = location(path) or "body"
    shown = json.dumps(error.instance, default=str)
    if len(shown) > MAX_SHOWN:
        shown = shown[:MAX_SHOWN] + "..."
    rule = error.validator
    expected = json.dumps(error.validator_value, default=str)
    if len(expected) > MAX_SHOWN:
        expected = "the schema"
    return param, f"Invalid value for `{param}`: {shown} fails `{rule}` ({expected})."


class OpenAIBodyValidator(JSONRequestBodyValidator):  # type: ignore[misc]
    """JSON bodies checked against the operation's schema; failures as OpenAI errors."""

    async def _parse(self, stream: Any, scope: Any) -> Any:
        raw = b"".join([message async for message in stream])
        if not raw:
            return None
        try:
            return json.loads(raw.decode(self._encoding))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError("invalid_json", f"The request body is not valid JSON: {exc}") from exc

    def _validate(self, body: Any) -> dict[str, Any] | None:
        if body is None:
            raise ApiError("invalid_parameter", "The request needs a JSON body.", "body")
        error = best_match(self._validator.iter_errors(body))
        if error is not None:
            param, message = _describe(error)
            raise InvalidParameter(param, message)
        return None


class OpenAIParameterValidator(ParameterValidator):  # type: ignore[misc]
    """Query, path, header and cookie parameters; a failure names the parameter."""

    def validate_request(self, request: Any) -> None:
        checks = {
            "query": self.validate_query_parameter,
            "path": self.validate_path_parameter,
            "header": self.validate_header_parameter,
            "cookie": self.validate_cookie_parameter,
        }
        for where, check in checks.items():
            for param in self.parameters.get(where, []):
                error = check(param, request)
                if error:
                    reason = str(error).splitlines()[0]
                    raise InvalidParameter(
                        param["name"], f"Invalid {where} parameter `{param['name']}`: {reason}"
                    )
