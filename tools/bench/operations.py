"""What watching the server costs: throughput with metrics and tracing on against off (issue 47).

    python -m tools.bench.operations [--rounds 9] [--tokens 64] [--clients 8] [--threads N]

Two `miserver serve` processes on loopback, the embedded default model, the README's
settings otherwise, started side by side and measured in one run:

- `on`: metrics on (the default) and `--otlp-traces-endpoint` to an OTLP/HTTP receiver on
  loopback (a child process, so its work competes with neither server's nor the clients'
  interpreter), which decodes every export with OpenTelemetry's own protobuf messages and
  counts its spans; while a round runs, a scraper reads `GET /metrics` every `--scrape`
  seconds (0.5 by default, thirty times Prometheus's default rate).
- `off`: `--no-metrics` and no traces endpoint.

A round is `--clients` greedy chat completions at once (each its own prompt, `max_tokens`
`--tokens`, `ignore_eos`, so every request makes the same count), then one request alone
(`--tokens` twice): throughput is the completion tokens over the round's wall time. The
server's CPU time over the round (/proc, every thread) per token is the cost beside it, which
a machine shared with other work disturbs less than the wall time.
The `on` server also runs each round unscraped (`on, not scraped`: what metrics and traces
cost without a scraper). Rounds are mirrored (`common.mirrored`: on, on not scraped, off,
then backwards, ...) after a warm-up of each. Goal: on / off >= 0.98. The table, the spans
received against the requests sent, and each server's backend go to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from miserver.settings import from_env
from tools.bench import common
from tools.bench.rows import health, messages

log = logging.getLogger("bench.operations")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
GOAL = 0.98


def _receive(spans: Any, port: Any) -> None:
    """The receiver child: an OTLP/HTTP traces endpoint counting the spans it decodes."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            found = ExportTraceServiceRequest.FromString(body)
            count = sum(len(scope.spans) for rs in found.resource_spans for scope in rs.scope_spans)
            with spans.get_lock():
                spans.value += count
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            return

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port.value = http.server_address[1]
    http.serve_forever()


class Receiver:
    """An OTLP/HTTP traces receiver on loopback, in a child process; `spans` received."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._spans, port = context.Value("q", 0), context.Value("i", 0)
        self._child = context.Process(target=_receive, args=(self._spans, port), daemon=True)
        self._child.start()
        while not port.value:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port.value}/v1/traces"

    @property
    def spans(self) -> int:
        return int(self._spans.value)

    def close(self) -> None:
        self._child.terminate()
        self._child.join()


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used so far, every thread, user and system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def scraping(client: httpx.Client, base_url: str, every: float) -> Iterator[list[int]]:
    """`GET /metrics` every `every` seconds until the block ends; yields the scrape count."""
    done, count = threading.Event(), [0]
    url = base_url.removesuffix("/v1") + "/metrics"

    def scrape() -> None:
        while not done.wait(every):
            client.get(url).raise_for_status()
            count[0] += 1

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield count
    finally:
        done.set()
        thread.join()


def _chat(client: httpx.Client, base_url: str, i: int, tokens: int) -> common.Run:
    body = {**common.chat_body(MODEL_ID, messages(i), tokens, stream=False), "ignore_eos": True}
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    found = response.json()
    return common.Run(found["usage"]["completion_tokens"], seconds, "")


def round_of(
    pool: ThreadPoolExecutor,
    client: httpx.Client,
    server: tuple[str, int],
    args: argparse.Namespace,
    scrape: float | None,
    cpu: list[float],
) -> common.Run:
    """`args.clients` chats at once, then one alone: tokens over the round's wall time; the
    server's CPU seconds a token appended to `cpu`."""
    base_url, pid = server
    with contextlib.ExitStack() as stack:
        if scrape is not None:
            stack.enter_context(scraping(client, base_url, scrape))
        spent = cpu_seconds(pid)
        started = time.perf_counter()
        futures = [
            pool.submit(_chat, client, base_url, i, args.tokens) for i in range(args.clients)
        ]
        runs = [f.result() for f in futures]
        runs.append(_chat(client, base_url, args.clients, 2 * args.tokens))
        seconds = time.perf_counter() - started
    tokens = sum(r.tokens for r in runs)
    cpu.append((cpu_seconds(pid) - spent) / tokens)
    return common.Run(tokens, seconds, "")


Measured = tuple[dict[str, list[common.Run]], dict[str, list[float]], str]


def measure(args: argparse.Namespace, work: Path) -> Measured:
    receiver = Receiver()
    cache_dir = from_env().cache_dir
    threads = [] if args.threads is None else ["--threads", str(args.threads)]
    on_args = [*threads, "--otlp-traces-endpoint", receiver.url]
    off_args = [*threads, "--no-metrics"]
    try:
        with (
            common.served_process(work / "on", cache_dir, args.threads, on_args) as on,
            common.served_process(work / "off", cache_dir, args.threads, off_args) as off,
            httpx.Client(timeout=600.0) as client,
            ThreadPoolExecutor(max_workers=args.clients) as pool,
        ):
            (on_url, on_process), (off_url, off_process) = on, off
            servers = {"on": (on_url, on_process.pid), "off": (off_url, off_process.pid)}
            scraped = {"on": args.scrape, "on, not scraped": None, "off": None}
            cpu: dict[str, list[float]] = {name: [] for name in scraped}
            paths: dict[str, Callable[[], common.Run]] = {
                name: partial(
                    round_of, pool, client, servers[name.split(",")[0]], args, scrape, cpu[name]
                )
                for name, scrape in scraped.items()
            }
            runs = common.mirrored(paths, args.rounds)
            cpu = {name: found[1:] for name, found in cpu.items()}  # less the warm-up
            backend = health(client, on_url)
            client.get(off_url.removesuffix("/v1") + "/metrics")  # 404: off indeed
        sent = 2 * (args.rounds + 1) * (args.clients + 1)
        facts = (
            f"backend: {backend['backend']}, parallel {backend['parallel']}; spans received "
            f"by the receiver: {receiver.spans} for {sent} requests to `on` (4 or 5 each)"
        )
    finally:
        receiver.close()
    return runs, cpu, facts


def report(measured: Measured, args: argparse.Namespace) -> str:
    runs, cpu, facts = measured
    rates = {name: [r.rate for r in found] for name, found in runs.items()}
    lines = [
        f"{args.clients} clients x {args.tokens} tokens, then 1 x {2 * args.tokens}, "
        f"{args.rounds} mirrored rounds; `on` scraped every {args.scrape} s",
        "",
        "| server | median tok/s | min | max | / off (median of the rounds' ratios) "
        "| CPU ms a token | off / this (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, found in rates.items():
        ratio = statistics.median(a / b for a, b in zip(found, rates["off"], strict=True))
        spent = statistics.median(cpu[name])
        lean = statistics.median(b / a for a, b in zip(cpu[name], cpu["off"], strict=True))
        lines.append(
            f"| {name} | {statistics.median(found):.1f} | {min(found):.1f} | {max(found):.1f} "
            f"| {ratio:.3f} | {spent * 1e3:.2f} | {lean:.3f} |"
        )
    pairs = [on / off for on, off in zip(rates["on"], rates["off"], strict=True)]
    ratio = statistics.median(pairs)
    lines += [
        "",
        f"on / off: **{ratio:.3f}** (rounds: {', '.join(f'{p:.3f}' for p in pairs)}); "
        f"goal >= {GOAL}: {'met' if ratio >= GOAL else 'not met'}",
        "",
        facts,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--scrape", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(args, Path(tmp))
    sys.stdout.write(report(measured, args) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
