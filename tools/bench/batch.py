"""The Batch API against the same lines sent by concurrent clients (issue 50 acceptance).

    python -m tools.bench.batch [--lines 1000] [--tokens 16] [--clients 8] [--rounds 2]
                                [--probe-every 3] [--idle-probes 8] [--threads N]

One `miserver serve` on loopback, the embedded default model, the README's settings
otherwise. `--lines` greedy chat requests, each its own prompt, `max_tokens` `--tokens` and
`ignore_eos` (every line makes the same count), are run two ways in each round, in mirrored
order (batch then clients, then clients then batch, ...), each way's prompts tagged with the
way and the round (no way finds the other's prompts in the prompt cache):

- `batch`: one JSONL file uploaded, one batch made, polled until `completed`; its
  throughput is the batch's `usage.output_tokens` over the wall time from `POST
  /v1/batches` to the poll that sees it done;
- `clients`: the same bodies posted by `--clients` concurrent clients, each taking the next
  line when its last one is answered; throughput is the completion tokens over the wall time.

While either runs, an interactive client streams a chat request of its own (a fresh prompt,
8 tokens) every `--probe-every` seconds and times its first content (TTFT), as it does
`--idle-probes` times on the idle server before each round. Goals: batch ÷ clients
throughput >= 0.9 (median of the rounds' ratios); the interactive TTFT while the batch runs
<= 1.5× its TTFT idle (medians over every probe). The table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from miserver.settings import from_env
from tools.bench import common
from tools.bench.rows import TOPICS, health

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
THROUGHPUT_GOAL, TTFT_GOAL = 0.9, 1.5
PROBE_TOKENS = 8


@dataclass(slots=True)
class Phase:
    """One way of running the lines: tokens made, wall seconds, TTFTs of the probes."""

    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def body(i: int, tokens: int, tag: str = "") -> dict[str, Any]:
    """Line `i`; `tag` makes a way's prompts its own in a round (none is in the prompt cache
    from the other way's run)."""
    topic = TOPICS[i % len(TOPICS)]
    content = f"{tag}Write a short story about {topic}, number {i}."
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


class Prober:
    """The interactive client: a fresh streamed prompt at a time, its TTFT kept."""

    def __init__(self, client: httpx.Client, base_url: str) -> None:
        self._client = client
        self._base_url = base_url
        self._count = 0

    def probe(self) -> float:
        self._count += 1
        content = f"In one sentence, what is a {TOPICS[self._count % len(TOPICS)]}? ({self._count})"
        messages = [{"role": "user", "content": content}]
        run = common.server_stream(
            self._client, self._base_url, PROBE_TOKENS, model=MODEL_ID, messages=messages
        )
        return run.ttft

    def during(self, every: float, stop: threading.Event, into: list[float]) -> None:
        """Probe every `every` seconds until `stop` is set."""
        while not stop.wait(every):
            into.append(self.probe())


def run_batch(client: httpx.Client, base_url: str, lines: list[dict[str, Any]]) -> Phase:
    content = "".join(
        json.dumps(
            {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}
        )
        + "\n"
        for i, b in enumerate(lines)
    )
    upload = {"purpose": "batch", "filename": "bench.jsonl", "content": content}
    made = client.post(f"{base_url}/files", json=upload)
    made.raise_for_status()
    request = {
        "input_file_id": made.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    started = time.perf_counter()
    created = client.post(f"{base_url}/batches", json=request)
    created.raise_for_status()
    batch_id = created.json()["id"]
    while (batch := client.get(f"{base_url}/batches/{batch_id}").json())["status"] != "completed":
        if batch["status"] in ("failed", "cancelled", "expired"):
            raise RuntimeError(f"the batch ended {batch['status']}")
        time.sleep(0.25)
    seconds = time.perf_counter() - started
    counts = batch["request_counts"]
    if counts["failed"]:
        raise RuntimeError(f"{counts['failed']} lines failed")
    return Phase(batch["usage"]["output_tokens"], seconds)


def run_clients(
    client: httpx.Client, base_url: str, lines: list[dict[str, Any]], clients: int
) -> Phase:
    def send(line: dict[str, Any]) -> int:
        answer = client.post(f"{base_url}/chat/completions", json=line)
        answer.raise_for_status()
        return int(answer.json()["usage"]["completion_tokens"])

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(send, lines))
    return Phase(tokens, time.perf_counter() - started)


def measured(prober: Prober, every: float, work: Any) -> Phase:
    """`work()`'s phase, with the interactive client probing while it runs."""
    stop = threading.Event()
    ttft: list[float] = []
    thread = threading.Thread(target=prober.during, args=(every, stop, ttft), daemon=True)
    thread.start()
    try:
        phase: Phase = work()
    finally:
        stop.set()
        thread.join()
    phase.ttft = ttft
    return phase


def rounds(args: argparse.Namespace, base_url: str) -> tuple[dict[str, list[Phase]], list[float]]:
    limits = httpx.Limits(max_connections=args.clients + 4)
    with httpx.Client(timeout=600.0, limits=limits) as client:
        prober = Prober(client, base_url)

        def lines(tag: str, count: int = args.lines) -> list[dict[str, Any]]:
            return [body(i, args.tokens, tag) for i in range(count)]

        ways = {
            "batch": lambda tag: run_batch(client, base_url, lines(tag)),
            "clients": lambda tag: run_clients(client, base_url, lines(tag), args.clients),
        }
        run_batch(client, base_url, lines("Warm up. ", 4 * args.clients))  # not counted
        run_clients(client, base_url, lines("Warm up too. ", 4 * args.clients), args.clients)
        phases: dict[str, list[Phase]] = {name: [] for name in ways}
        idle: list[float] = []
        for i in range(args.rounds):
            idle += [prober.probe() for _ in range(args.idle_probes)]
            order = list(ways) if i % 2 == 0 else list(reversed(ways))
            for name in order:
                tag = f"({name} {i + 1}) "
                phases[name].append(measured(prober, args.probe_every, partial(ways[name], tag)))
                rate = phases[name][-1].rate
                sys.stderr.write(f"round {i + 1}: {name} {rate:.1f} tok/s\n")
        backend = health(client, base_url)
    sys.stdout.write(f"backend: {backend.get('backend')}, rows {backend.get('parallel')}\n")
    return phases, idle


def report(args: argparse.Namespace, phases: dict[str, list[Phase]], idle: list[float]) -> str:
    ratios = [b.rate / c.rate for b, c in zip(phases["batch"], phases["clients"], strict=True)]
    ttft = {name: [t for p in runs for t in p.ttft] for name, runs in phases.items()}
    ms = {name: statistics.median(values) * 1000 for name, values in ttft.items()}
    idle_ms = statistics.median(idle) * 1000
    rows = [
        "| way | tok/s per round | median tok/s | interactive TTFT ms (median, probes) |",
        "|---|---|---|---|",
        f"| idle server | - | - | {idle_ms:.0f} ({len(idle)}) |",
    ]
    for name, runs in phases.items():
        rates = ", ".join(f"{p.rate:.1f}" for p in runs)
        median = statistics.median(p.rate for p in runs)
        rows.append(f"| {name} | {rates} | {median:.1f} | {ms[name]:.0f} ({len(ttft[name])}) |")
    ratio = statistics.median(ratios)
    busy = ms["batch"] / idle_ms
    rows += [
        "",
        f"{args.lines} lines of {args.tokens} tokens, {args.clients} clients, "
        f"{args.rounds} rounds.",
        f"- batch / clients throughput: {ratio:.3f} (rounds: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}); goal >= {THROUGHPUT_GOAL}: "
        f"{'met' if ratio >= THROUGHPUT_GOAL else 'NOT met'}",
        f"- interactive TTFT during the batch / idle: {busy:.2f}; goal <= {TTFT_GOAL}: "
        f"{'met' if busy <= TTFT_GOAL else 'NOT met'}",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probe-every", type=float, default=3.0)
    parser.add_argument("--idle-probes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as work:
        cache_dir = from_env().cache_dir
        with common.served(Path(work) / "data", cache_dir, args.threads) as base_url:
            phases, idle = rounds(args, base_url)
    sys.stdout.write(report(args, phases, idle) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
