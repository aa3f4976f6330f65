"""Schemathesis 4 driven from Python, bounded: the engine of the `openapi_conformance` check.

Each operation of the document gets Hypothesis runs of positive and negative
cases (`max_examples` each, derandomized, no shrinking, no example database),
and every response goes through Schemathesis' response checks. Failures are
collected, never raised: the caller reports them all at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .context import Context

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
CONFIG = {"output": {"sanitization": {"enabled": False}}, "generation": {"database": "none"}}
REQUEST_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Finding:
    """One Schemathesis failure: where, what kind, its message, and a curl that reproduces it."""

    operation: str
    title: str
    message: str
    curl: str


def _operations(document: dict[str, Any]) -> list[Any]:
    schema = schemathesis.openapi.from_dict(document, config=schemathesis.Config.from_dict(CONFIG))
    operations = []
    for result in schema.get_all_operations():
        if hasattr(result, "err"):
            raise RuntimeError(f"Schemathesis cannot read an operation: {result.err()}")
        operations.append(result.ok())
    return operations


def _exercise(
    operation: Any, mode: GenerationMode, ctx: Context, edit: Callable[[Any], None]
) -> list[Finding]:
    found: list[Finding] = []

    @settings(
        max_examples=ctx.max_examples,
        phases=[Phase.explicit, Phase.generate],
        database=None,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(operation.as_strategy(generation_mode=mode))
    def exercise(case: Any) -> None:
        edit(case)
        try:
            case.call_and_validate(
                base_url=ctx.base_url,
                headers=ctx.auth_headers,
                checks=CHECKS,
                timeout=REQUEST_TIMEOUT_S,
            )
        except FailureGroup as group:
            curl = case.as_curl_command(headers=ctx.auth_headers, base_url=ctx.base_url)
            found.extend(
                Finding(operation.label, str(f.title), (f.message or "").strip(), curl)
                for f in group.exceptions
            )

    # Unsatisfiable: no case of this mode exists (e.g. negatives for a parameterless GET)
    with contextlib.suppress(Unsatisfiable):
        exercise()
    return found


def run(document: dict[str, Any], ctx: Context, edit: Callable[[Any], None]) -> list[Finding]:
    """Every Schemathesis failure the bounded run finds against `ctx.base_url`."""
    failures: list[Finding] = []
    for operation in _operations(document):
        for mode in MODES:
            failures.extend(_exercise(operation, mode, ctx, edit))
    return failures
