"""What a check can end with, besides passing.

    Exception
     +-- NotOffered               the server does not offer the extension (not a failure)
     +-- Failure                  the server broke the contract: expected vs received
          +-- StatusMismatch          the HTTP status is not the one the contract gives
          +-- ErrorShapeViolation     an error body is not `{"error": {message, type, param, code}}`
          +-- ErrorCodeMismatch       an error's `code` or `param` is not the one the contract gives
          +-- BodyShapeViolation      a JSON body lacks a field or has a wrong value
          +-- StreamFramingViolation  SSE events are framed, typed or ordered wrongly
          +-- HeaderViolation         an X-miLLM-* header is missing, extra or malformed
          +-- SteeringHashMismatch    X-miLLM-Steering's hash is not the hash of what was sent
          +-- StrictModeViolation     X-miLLM-Strict did not refuse, or refused wrongly
          +-- SchemaViolations        Schemathesis found responses outside the server's OpenAPI

Every failure is a dataclass with a `title` (its kind), what was `expected`,
what was `received`, and, where one statement was broken, its `requirement` ID.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class NotOffered(Exception):
    """The server does not offer what the check needs; the reason says how the kit could tell."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False)
class Failure(Exception):
    """The server broke the contract."""

    title: ClassVar[str] = "Contract violation"
    expected: str
    received: str
    requirement: str | None = None

    def __str__(self) -> str:
        where = f"[{self.requirement}] " if self.requirement else ""
        return f"{where}{self.title}: expected {self.expected}; received {self.received}"


@dataclass(eq=False)
class StatusMismatch(Failure):
    title: ClassVar[str] = "Unexpected status code"


@dataclass(eq=False)
class ErrorShapeViolation(Failure):
    title: ClassVar[str] = "Error body is not OpenAI's error shape"


@dataclass(eq=False)
class ErrorCodeMismatch(Failure):
    title: ClassVar[str] = "Error code or param is not the one the contract gives"


@dataclass(eq=False)
class BodyShapeViolation(Failure):
    title: ClassVar[str] = "Response body does not have the contract's shape"


@dataclass(eq=False)
class StreamFramingViolation(Failure):
    title: ClassVar[str] = "Server-sent events are framed or ordered wrongly"


@dataclass(eq=False)
class HeaderViolation(Failure):
    title: ClassVar[str] = "Response header is missing or malformed"


@dataclass(eq=False)
class SteeringHashMismatch(Failure):
    title: ClassVar[str] = "Steering-set hash differs from the hash of the set sent"


@dataclass(eq=False)
class StrictModeViolation(Failure):
    title: ClassVar[str] = "X-miLLM-Strict is not enforced as the contract says"


@dataclass(eq=False)
class SchemaViolations(Failure):
    title: ClassVar[str] = "Schemathesis found responses outside the server's own OpenAPI document"
