"""Prometheus metrics for `GET /metrics` (issue 47): vLLM's names and meanings, and
miserver's own under `miserver_`; the table is spec/policy/metrics.yaml.

One `Metrics` per server, with a registry of its own (two servers in one process never
share a counter). Counters and histograms move with the work as it happens:

- a generation request gets a `Watch` as it is accepted (its arrival), which sees its turn
  (`scheduled`: the queue time), each token of each choice (`token`: the first token of
  the request is its TTFT, every later one of a choice an inter-token latency), each
  choice's end (`ended`: a finished sequence by reason, its generated tokens) and the
  request's end (`finished`: the prompt tokens billed and those the prefix cache held,
  the end-to-end latency); a choice that never ended is an `abort` (`aborted`);
- an error answer is counted by its code where it is answered (http/metered.py).

The gauges are read when scraped (`live`): the scheduler's holders and waiters and the KV
tokens the running choices hold over the engine's capacity, so they can never drift from
what runs. A refused request is not a success, a stream is one request, and an unscraped
server pays a few counter increments a request and one histogram observation a token.

`--no-metrics` turns them off (`Metrics(live, on=False)`): every metric is `NULL`, which
records nothing, no gauge is read, `GET /metrics` answers 404, and a request's `Watch`
still times its phases for its `timings` and its trace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ABORT = "abort"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # one value
DOWNLOAD_ENDS = frozenset({"done", "error", "cancelled"})
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # the same value by vLLM's older name
)


@dataclass(frozen=True, slots=True)
class Row:
    """One metric of the table."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


@cache
def table() -> tuple[Row, ...]:
    """The rows of spec/policy/metrics.yaml, in its order."""
    path = resources.files("miserver.spec") / "policy" / "metrics.yaml"
    rows = yaml.safe_load(path.read_text("utf-8"))["metrics"]
    return tuple(
        Row(r["name"], r["kind"], str(r["help"]), tuple(r["labels"]), tuple(r.get("buckets", ())))
        for r in rows
    )


@dataclass(frozen=True, slots=True)
class Live:
    """What runs now, read at each scrape: the resident model (None: none), the requests
    holding a turn and waiting for one, the KV tokens in use and the KV capacity."""

    model: str | None
    running: int
    waiting: int
    kv_used: int
    kv_capacity: int


class _Gauges(Collector):
    """The gauges, read from `live()` when scraped."""

    def __init__(self, rows: Mapping[str, Row], live: Callable[[], Live]) -> None:
        self._rows = rows
        self._live = live

    def describe(self) -> Iterable[Metric]:
        """The families without their values (what registering reads: no `live()` yet)."""
        for name in GAUGES:
            row = self._rows[name]
            yield GaugeMetricFamily(name, row.help, labels=list(row.labels))

    def collect(self) -> Iterable[Metric]:
        now = self._live()
        model = [] if now.model is None else [now.model]
        usage = min(1.0, now.kv_used / now.kv_capacity) if now.kv_capacity > 0 else 0.0
        for name, value in zip(GAUGES, (now.running, now.waiting, usage, usage), strict=True):
            row = self._rows[name]
            family = GaugeMetricFamily(name, row.help, labels=list(row.labels))
            if model:
                family.add_metric(model, float(value))
            yield family


class _Null:
    """A metric that records nothing (metrics off): every label set is itself."""

    def labels(self, *_: str) -> _Null:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


NULL = _Null()


class Metrics:
    """The registry and every metric of the table; `live` reads the gauges' values. Off
    (`on=False`), every metric is `NULL` and nothing is registered."""

    def __init__(self, live: Callable[[], Live], *, on: bool = True) -> None:
        self.on = on
        self.registry = CollectorRegistry(auto_describe=True)
        rows = {row.name: row for row in table()}
        self._made: dict[str, Any] = {}
        for row in rows.values():
            if not on:
                made: Any = NULL
            elif row.kind == "counter":
                made = Counter(row.name, row.help, row.labels, registry=self.registry)
            elif row.kind == "histogram":
                made = Histogram(
                    row.name, row.help, row.labels, buckets=row.buckets, registry=self.registry
                )
            else:
                continue
            self._made[row.name] = made
        if on:
            self.registry.register(_Gauges(rows, live))
        self._kv = 0  # the KV tokens the running choices hold (`Watch`)
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Any:
        return self._made[name]

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format."""
        return generate_latest(self.registry)

    def request(self, model: str) -> Watch:
        """A generation request accepted now, for `model`."""
        return Watch(self, model)

    def refused(self, code: str) -> None:
        self["miserver_refusals"].labels(code).inc()

    def verdicts(self, found: Iterable[tuple[str, str, str]]) -> None:
        """Probe results recorded: (probe, outcome, verdict) each."""
        for probe, outcome, verdict in found:
            self["miserver_probe_verdicts"].labels(probe, outcome, verdict).inc()

    def download(self, event: Mapping[str, Any]) -> None:
        """A `download` event of the bus (models/downloads.py): a job's last one counts by
        its state (done, error, cancelled)."""
        state = event.get("state")
        if state in DOWNLOAD_ENDS:
            self["miserver_downloads"].labels(state).inc()

    @property
    def kv_used(self) -> int:
        return self._kv

    def held(self, tokens: int) -> None:
        """`tokens` more (or fewer, negative) KV tokens held by running choices."""
        if not self.on:
            return
        with self._lock:
            self._kv += tokens


@dataclass(slots=True)
class Watch:
    """One generation request's metrics, from its arrival (made) to its end."""

    metrics: Metrics
    model: str
    arrived: float = field(default_factory=time.perf_counter)
    _turn: float | None = None  # when it got its turn
    _first: float | None = None  # its first token
    _last: float | None = None  # its latest token
    _open: int = 0  # choices started and not ended
    _held: int = 0  # KV tokens this request's choices hold now
    _done: bool = False

    @property
    def first(self) -> float | None:
        """When its first token came (perf_counter), None before."""
        return self._first

    def phases(self) -> list[tuple[str, float, float]]:
        """Its phases so far, (name, start, end) on perf_counter: `queue` (arrival to turn),
        `prefill` (turn to first token), `decode` (first token to last), each once begun."""
        found = []
        if self._turn is not None:
            found.append(("queue", self.arrived, self._turn))
            if self._first is not None:
                found.append(("prefill", self._turn, self._first))
        if self._first is not None and self._last is not None:
            found.append(("decode", self._first, self._last))
        return found

    def scheduled(self) -> None:
        """The request got its turn: its queue time."""
        self._turn = time.perf_counter()
        queued = self._turn - self.arrived
        self.metrics["vllm:request_queue_time_seconds"].labels(self.model).observe(queued)

    def started(self, prompt_tokens: int) -> None:
        """A choice starts: its prompt held in the KV cache."""
        self._open += 1
        self._hold(prompt_tokens)

    def token(self, now: float, previous: float | None) -> None:
        """A generated token at `now`; `previous`, the choice's token before it (None for its
        first). Called from the engine's thread."""
        m, model = self.metrics, self.model
        if self._first is None:
            self._first = now
            m["vllm:time_to_first_token_seconds"].labels(model).observe(now - self.arrived)
            if self._turn is not None:
                m["vllm:request_prefill_time_seconds"].labels(model).observe(now - self._turn)
        elif previous is not None:
            for name in ITL:
                m[name].labels(model).observe(now - previous)
        self._last = now
        self._hold(1)

    def ended(self, reason: str, generated: int, prompt_tokens: int) -> None:
        """A choice of a `prompt_tokens` prompt ended with `reason` after `generated` tokens;
        its KV tokens are free."""
        self._open = max(0, self._open - 1)
        self.metrics["vllm:request_success"].labels(self.model, reason).inc()
        self.metrics["vllm:generation_tokens"].labels(self.model).inc(generated)
        self.metrics["vllm:request_generation_tokens"].labels(self.model).observe(generated)
        self._hold(-min(self._held, prompt_tokens + generated))

    def steered(self, source: str | None) -> None:
        """The request ran steered, its steering from `source` (None: it was not)."""
        if source is not None:
            self.metrics["miserver_steered_requests"].labels(self.model, source).inc()

    def finished(self, prompt_tokens: int, cached_tokens: int) -> None:
        """The request's end: its billed prompt, what the prefix cache held, its latency."""
        if self._done:
            return
        self._done = True
        m, model = self.metrics, self.model
        m["vllm:prompt_tokens"].labels(model).inc(prompt_tokens)
        m["vllm:request_prompt_tokens"].labels(model).observe(prompt_tokens)
        if self._first is not None and self._last is not None:
            m["vllm:request_decode_time_seconds"].labels(model).observe(self._last - self._first)
        m["vllm:prefix_cache_queries"].labels(model).inc(prompt_tokens)
        m["vllm:prefix_cache_hits"].labels(model).inc(cached_tokens)
        latency = time.perf_counter() - self.arrived
        m["vllm:e2e_request_latency_seconds"].labels(model).observe(latency)
        self._release()

    def timings(self, prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
        """The request's timings so far, with llama.cpp's server's names and meanings
        (`timings`) and `queue_ms`: its wait for a turn, its prompt's (from the turn to the
        first token, the `cached` tokens the KV already held not run), its generated tokens'
        (the first token to the last, `predicted_per_second` counting those after the
        first). The three spans add up to the request's time from its arrival to its last
        token (contract 0.27.0)."""
        now = time.perf_counter()
        turn = self.arrived if self._turn is None else self._turn
        first = now if self._first is None else self._first
        last = first if self._last is None else self._last
        queue, prompt, predicted = turn - self.arrived, first - turn, last - first
        prompt_n, decoded = max(prompt_tokens - cached, 0), max(completion_tokens - 1, 0)
        return {
            "queue_ms": queue * 1e3,
            "cache_n": cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt * 1e3,
            "prompt_per_token_ms": prompt * 1e3 / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt if prompt > 0 else 0.0,
            "predicted_n": completion_tokens,
            "predicted_ms": predicted * 1e3,
            "predicted_per_token_ms": predicted * 1e3 / decoded if decoded else 0.0,
            "predicted_per_second": decoded / predicted if predicted > 0 else 0.0,
        }

    def aborted(self) -> None:
        """The client left or the generation failed: each open choice ends as `abort`."""
        if self._done:
            return
        self._done = True
        for _ in range(self._open):
            self.metrics["vllm:request_success"].labels(self.model, ABORT).inc()
        self._open = 0
        self._release()

    def _hold(self, tokens: int) -> None:
        self._held += tokens
        self.metrics.held(tokens)

    def _release(self) -> None:
        self.metrics.held(-self._held)
        self._held = 0
