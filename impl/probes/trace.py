"""The trace a request joins: W3C Trace Context `traceparent` (OAI-PROBE-15/16).

Read with opentelemetry-api's W3C propagator. A header sent exactly once and
valid gives its trace id; a malformed one, one sent more than once, or none
(REQ-000 open point 24) gives a fresh random id. The request is never refused
for it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
HEADER = "traceparent"


def fresh() -> str:
    """A new trace id: 32 lowercase hex digits, never all zero."""
    while (value := secrets.token_hex(16)) == "0" * 32:
        continue
    return value


def trace_id(values: Sequence[str]) -> str:
    """The trace id of a request that sent these `traceparent` values."""
    if len(values) == 1:
        context = _PROPAGATOR.extract({HEADER: [values[0]]})
        span = trace.get_current_span(context).get_span_context()
        if span.is_valid:
            return format(span.trace_id, "032x")
    return fresh()
