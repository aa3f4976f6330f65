"""A bounded Schemathesis run against the server's own OpenAPI document (`{base}/openapi.json`).

Every operation the document lists gets `ctx.max_examples` positive and as
many negative cases (Hypothesis, derandomized, no shrinking), each checked by
Schemathesis for: no 5xx, documented status codes, content types, headers
and bodies, and invalid data refused with a 4xx. `positive_data_acceptance`
is not run: the contract refuses some schema-valid requests on purpose
(fields a model cannot honour, cross-field rules).

Generation stays short (`bounded`): `max_tokens` (`max_output_tokens` on a response)
at most 4 (4 when absent or 0, which asks for the server's default),
`n` at most 2, no `stream`, and any non-empty `model` replaced by the model
under test, so that requests reach the model instead of stopping at a 404.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ..context import Context
from ..failures import NotOffered, SchemaViolations
from ..registry import check

MAX_TOKENS = 4
MAX_N = 2
CEILINGS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # a reply's token cap
GENERATION_PATHS = ("/chat/completions", "/completions", "/responses")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bound_body(body: MutableMapping[str, Any], model: str) -> None:
    for name in CEILINGS:
        if _is_int(body.get(name)) and (body[name] > MAX_TOKENS or body[name] == 0):
            body[name] = MAX_TOKENS
    if all(body.get(name) is None for name in CEILINGS):
        body["max_output_tokens" if "input" in body else "max_tokens"] = MAX_TOKENS
    if _is_int(body.get("n")) and body["n"] > MAX_N:
        body["n"] = MAX_N
    if body.get("stream") is True:
        body["stream"] = False
    if isinstance(body.get("model"), str) and body["model"]:
        body["model"] = model


def bounded(case: Any, model: str) -> None:
    """Edit a generated case in place so a generation stays a few tokens long."""
    if isinstance(case.body, dict) and case.path.endswith(GENERATION_PATHS):
        _bound_body(case.body, model)
    _ = case.meta  # Schemathesis re-labels the case (positive / negative) by what is sent


def _document(ctx: Context) -> dict[str, Any]:
    url = f"{ctx.base_url}/openapi.json"
    response = ctx.client.get(url)
    try:
        document = response.json() if response.status_code == 200 else None
    except ValueError:
        document = None
    if not isinstance(document, dict) or "paths" not in document:
        raise NotOffered(f"GET {url} answers {response.status_code}, not an OpenAPI document")
    return document


def _summary(findings: list[Any]) -> str:
    """Distinct (operation, kind, first message line), and a curl reproducing the first."""
    seen: dict[tuple[str, str, str], None] = {}
    for finding in findings:
        first = finding.message.splitlines()[:1]
        seen[(finding.operation, finding.title, first[0] if first else "")] = None
    lines = [f"{op}: {title}{' - ' + msg if msg else ''}" for op, title, msg in seen]
    text = f"{len(lines)} distinct failure(s): " + "; ".join(lines[:12])
    return f"{text}; reproduce the first with: {findings[0].curl}"


@check("OAI-GEN-01", "OAI-ERR-01")
def openapi_conformance(ctx: Context) -> None:
    """Schemathesis: no 5xx, responses as documented, invalid input refused (bounded examples)."""
    document = _document(ctx)
    try:
        from .. import fuzzing
    except ImportError as exc:  # schemathesis is an optional dependency of the kit
        raise RuntimeError(f"{exc}: install schemathesis>=4,<5 to run this check") from None
    failures = fuzzing.run(document, ctx, lambda case: bounded(case, ctx.model))
    if failures:
        raise SchemaViolations(
            f"every response to match {ctx.base_url}/openapi.json",
            _summary(failures),
            "OAI-ERR-01",
        )
