"""Request-body validation against spec/openapi, reported the OpenAI way.

Connexion's JSON body validator raises RFC 7807 problems; this one raises
ApiError with `param` as the failing field's path (`messages[0].role`). It
validates the document the security middleware already parsed (a body that
is not strict JSON never gets here: http/body.py). `/v1` answers
`invalid_parameter`, except for a message `role` outside the known ones or
of the wrong type, which is `invalid_request` as REQ-003 LOC-CHAT-04 says
(document 000 names no code for it). `/api` answers `invalid_request` for a
body that is not a JSON object, or holds a field of the wrong JSON type
(LOC-GEN-14); a value its schema refuses (a range, a choice, a
missing field) is `invalid_parameter` there too (docs/DECISIONS.md, statuses).

Each operation's schema is compiled once. A body is first checked by
jsonschema-rs (microseconds, against a copy of the schema that spells
OpenAPI's `nullable` as JSON Schema's `null`); only a body it refuses goes to
the Python validator, Connexion's own, which decides and words the error. So a
body is refused exactly when Connexion's validator refuses it, as long as the
fast check accepts nothing that validator refuses (tests/unit/test_validation.py
holds the two to that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import jsonschema_rs
from connexion.json_schema import Draft4RequestValidator
from connexion.validators import JSONRequestBodyValidator, ParameterValidator
from jsonschema import Draft4Validator
from jsonschema.exceptions import ValidationError, best_match

from ..errors import ApiError, InvalidParameter
from .body import BODY_KEY, location, parsed

MAX_SHOWN = 120


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


@dataclass(frozen=True, slots=True)
class Compiled:
    """One operation's body schema, compiled both ways."""

    schema: dict[str, Any]  # held, so that its id is never another schema's
    fast: Any  # jsonschema_rs.Draft4Validator, over `with_null(schema)`
    full: Draft4Validator  # Connexion's request validator: the judge, and the words

    @classmethod
    def of(cls, schema: dict[str, Any]) -> Compiled:
        fast = jsonschema_rs.Draft4Validator(with_null(schema), validate_formats=True)
        full = Draft4RequestValidator(schema, format_checker=Draft4Validator.FORMAT_CHECKER)
        return cls(schema, fast, full)

    def passes(self, body: Any) -> bool:
        """Whether the fast check accepts `body` (False: ask `full`)."""
        try:
            return bool(self.fast.is_valid(body))
        except (ValueError, TypeError, OverflowError):  # a value it cannot read: let full judge
            return False


_COMPILED: dict[int, Compiled] = {}  # by id(schema): Connexion hands each operation's own dict
MAX_COMPILED = 512  # more than the documents hold operations: a bound, never reached


def compiled(schema: dict[str, Any]) -> Compiled:
    found = _COMPILED.get(id(schema))
    if found is None or found.schema is not schema:
        if len(_COMPILED) >= MAX_COMPILED:
            _COMPILED.clear()
        found = _COMPILED[id(schema)] = Compiled.of(schema)
    return found


def with_null(schema: Any) -> Any:
    """A copy of `schema` where `nullable: true` (or `x-nullable`) is JSON Schema: `null`
    joins its `type` and its `enum`, which is what Connexion's validator lets through
    (connexion.json_schema.allow_nullable) and no more."""
    if isinstance(schema, list):
        return [with_null(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    copy = {key: with_null(value) for key, value in schema.items()}
    if copy.get("x-nullable") is True or copy.get("nullable"):  # as allow_nullable reads it
        kind = copy.get("type")
        if isinstance(kind, str):
            copy["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            copy["type"] = [*kind, "null"]
        if isinstance(copy.get("enum"), list) and None not in copy["enum"]:
            copy["enum"] = [*copy["enum"], None]
    return copy


class OpenAIBodyValidator(JSONRequestBodyValidator):  # type: ignore[misc]
    """JSON bodies checked against the operation's schema; failures as OpenAI errors."""

    mistyped = "invalid_parameter"  # no body, or a field of the wrong JSON type
    invalid = "invalid_parameter"  # a value the schema refuses
    by_field: ClassVar[dict[str, str]] = {
        "role": "invalid_request"
    }  # an unknown or mistyped role (LOC-CHAT-04)

    async def _parse(self, stream: Any, scope: Any) -> Any:
        """The document the security middleware parsed (http/body.py): a body is read once."""
        async for _ in stream:
            pass
        return parsed(scope)

    def _validate(self, body: Any) -> dict[str, Any] | None:
        if body is None:
            raise ApiError(self.mistyped, "The request needs a JSON body.", "body")
        schema = compiled(self._schema)
        if schema.passes(body):
            return None
        errors = list(schema.full.iter_errors(body))
        error = best_match(errors)
        if error is not None:
            param, message = _describe(error)
            code = self.mistyped if _mistyped(error, errors) else self.invalid
            if error.validator in {"enum", "type"} and error.absolute_path:
                code = self.by_field.get(str(error.absolute_path[-1]), code)
            raise ApiError(code, message, param)
        return None


class LocalBodyValidator(OpenAIBodyValidator):
    """`/api` bodies: a JSON object or nothing, else 400 invalid_request (LOC-GEN-14)."""

    mistyped = "invalid_request"

    async def _parse(self, stream: Any, scope: Any) -> Any:
        body = await super()._parse(stream, scope)
        if BODY_KEY in scope and not isinstance(body, dict):  # `null` too; no body is none
            shown = "null" if body is None else type(body).__name__
            raise ApiError(self.mistyped, f"The request body must be a JSON object, not {shown}.")
        return body


def _mistyped(error: ValidationError, errors: list[ValidationError]) -> bool:
    """Whether the field `error` names has the wrong JSON type (a `type` error there)."""
    return any(e.validator == "type" and e.absolute_path == error.absolute_path for e in errors)


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
