"""OpenTelemetry traces of generation requests (issue 47 item 3, contract 0.27.0).

With `--otlp-traces-endpoint URL` (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) every
chat and text completion request becomes a span named after its route, a
child of the W3C trace its one valid `traceparent` names (else the root of a
new trace), with a child span per phase: `queue` (its wait for a turn),
`prefill` (the turn to the first token), `decode` (the first token to the
last) and, for a stream, `stream` (the first token to the stream's end). A
request that fails or whose client leaves ends with an error status.

The spans are made when the request ends, from the times its metrics watch
recorded (metrics.Watch), so nothing runs on the request's path while it
generates; opentelemetry-sdk's batch processor sends them by OTLP over HTTP
from its own thread. Without the setting nothing is made: no provider, no
exporter, no span (`Tracing(None)`), and a request costs one `None` check.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .metrics import Watch

_PROPAGATOR = TraceContextTextMapPropagator()
SERVICE = "miserver"


class Tracing:
    """The server's tracer: exports to `endpoint` (OTLP over HTTP), or off (None)."""

    def __init__(self, endpoint: str | None) -> None:
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if endpoint:
            provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
            self._provider, self._tracer = provider, provider.get_tracer(SERVICE)

    @property
    def on(self) -> bool:
        return self._tracer is not None

    def request(self, name: str, traceparent: Sequence[str], streamed: bool) -> RequestTrace | None:
        """What one request's spans need, made as it is accepted; None while off."""
        if self._tracer is None:
            return None
        return RequestTrace(self._tracer, name, tuple(traceparent), streamed)

    def flush(self) -> None:
        """Send every span ended so far (a test's, or the server's at its end)."""
        if self._provider is not None:
            self._provider.force_flush()

    def close(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = self._tracer = None


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """One request's spans, made at its end (`end`) from its watch's times."""

    tracer: trace.Tracer
    name: str
    traceparent: tuple[str, ...]
    streamed: bool

    def end(self, watch: Watch, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """The request's span and its phases', ending now; `error`: why it failed."""
        now, wall = time.perf_counter(), time.time_ns()

        def ns(at: float) -> int:
            return wall - int((now - at) * 1e9)

        parent = None
        if len(self.traceparent) == 1:  # one header or none: never refused (open point 24)
            parent = _PROPAGATOR.extract({"traceparent": list(self.traceparent)})
        root = self.tracer.start_span(
            self.name,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=ns(watch.arrived),
            attributes=dict(attributes),
        )
        inside = trace.set_span_in_context(root)
        phases = watch.phases()
        if self.streamed and watch.first is not None:
            phases.append(("stream", watch.first, now))
        for phase, start, end in phases:
            span = self.tracer.start_span(phase, context=inside, start_time=ns(start))
            span.end(end_time=ns(end))
        if error is not None:
            root.set_status(Status(StatusCode.ERROR, error))
        root.end(end_time=ns(now))
