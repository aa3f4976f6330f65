"""OpenTelemetry traces (issue 47 item 3, contract 0.27.0): the default GGUF server sending
its spans by OTLP over HTTP to a receiver this test runs on loopback, decoded with
OpenTelemetry's own protobuf messages."""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, LocalClient, cache_dir
from tests.events import data_of

pytestmark = pytest.mark.model

PHASES = ["queue", "prefill", "decode"]


class Receiver:
    """An OTLP/HTTP traces receiver on loopback: every export's spans, kept."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1/traces"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def spans(self) -> list[Span]:
        found = []
        for body in self.bodies:
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    found.extend(scope.spans)
        return found


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, TestClient, Receiver]]:
    receiver = Receiver()
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("traces"),
        cache_dir=cache_dir(),
        threads=ENGINE_THREADS,
        otlp_traces_endpoint=receiver.url,
    )
    server = Server(settings)
    with LocalClient(server, raise_server_exceptions=False) as client:
        yield server, client, receiver
    receiver.http.shutdown()
    receiver.http.server_close()


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Name three colours."}]
    return {"model": GGUF_ID, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def attributes(span: Span) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        found[item.key] = value.int_value if value.HasField("int_value") else value.string_value
    return found


def tree(spans: list[Span], root: Span) -> dict[str, Span]:
    """The root's children by name, each within the root's time."""
    children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    for child in children.values():
        assert child.trace_id == root.trace_id
        assert root.start_time_unix_nano <= child.start_time_unix_nano
        assert child.end_time_unix_nano <= root.end_time_unix_nano
    return children


def test_a_request_is_a_span_of_the_trace_it_joins(
    traced: tuple[Server, TestClient, Receiver],
) -> None:
    """Issue 47 item 3: a request with a `traceparent` is a SERVER span of that trace, child
    of its parent span, with its model and token counts; its queue, prefill and decode are
    child spans in order; a stream without one starts a trace of its own and has a `stream`
    span too."""
    server, client, receiver = traced
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    header = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    reply = client.post("/v1/chat/completions", json=chat(), headers=header)
    assert reply.status_code == 200, reply.text
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as streamed:
        assert [c for c in data_of(list(streamed.iter_lines())) if c == "[DONE]"]
    server.tracing.flush()
    spans = receiver.spans()
    roots = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert len(roots) == 2
    joined = next(s for s in roots if s.trace_id.hex() == trace_id)
    assert joined.parent_span_id.hex() == parent_id and joined.kind == Span.SPAN_KIND_SERVER
    usage = reply.json()["usage"]
    assert attributes(joined) == {
        "gen_ai.request.model": GGUF_ID,
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "miserver.endpoint": "chat",
    }
    phases = tree(spans, joined)
    assert sorted(phases) == sorted(PHASES)
    ordered = [phases[name] for name in PHASES]
    for before, after in itertools.pairwise(ordered):
        assert before.end_time_unix_nano <= after.start_time_unix_nano + 1000  # 1 µs rounding
    own = next(s for s in roots if s is not joined)
    assert own.trace_id.hex() != trace_id and not own.parent_span_id
    assert sorted(tree(spans, own)) == sorted([*PHASES, "stream"])


def test_no_endpoint_makes_no_spans(tmp_path: Path) -> None:
    """Without `--otlp-traces-endpoint` nothing is made: no provider, no exporter."""
    server = Server(Settings(data_dir=tmp_path, cache_dir=cache_dir()), preload=False)
    try:
        assert not server.tracing.on
    finally:
        server.shutdown()
