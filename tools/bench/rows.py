"""What the row benchmarks share: the prompts, the clients, TTFT rounds and the tables.

`tools.bench.concurrency` (llama.cpp) and `tools.bench.transformers_rows` (transformers)
measure the same things on two engines, each its own entry point:

- `messages(i)`: the i-th of eight chat prompts ("Write a long story about <topic>.");
  `client_counts(parallel)`: the client counts of the server rounds (1, 2, 4, ... parallel).
- `health(client, base_url)`: the server's `/api/health/inference`.
- `stream(...)`: one greedy streamed chat, its seconds to the first content;
  `ttft_rounds(...)`: that request on the idle server and while `parallel - 1` others
  stream (`busy_ttft`), in rounds whose order alternates.
- `rows_table`, `ttft_table`, `goal_row`: the markdown tables and a goal's row.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import httpx

from tools.bench import common
from tools.bench.bare_batch import Batched

log = logging.getLogger("bench.rows")

TOPICS = [
    "a lighthouse keeper",
    "a dragon who loves books",
    "a journey across the desert",
    "a robot learning to paint",
    "a city under the sea",
    "two rival chefs",
    "a lost dog finding its way home",
    "the first colony on Mars",
]
WAIT_S = 60.0


def messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}]


def client_counts(parallel: int) -> list[int]:
    counts = [c for c in (1, 2, 4, 8, 16, 32, 64) if c < parallel]
    return [*counts, parallel]


def health(client: httpx.Client, base_url: str) -> dict[str, Any]:
    url = base_url.removesuffix("/v1") + "/api/health/inference"
    response = client.get(url)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def wait_for_slots(client: httpx.Client, base_url: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while health(client, base_url)["slots_in_use"] < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server never showed {count} slots in use")
        time.sleep(0.02)


def _content(line: str) -> bool:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    choices = json.loads(line[6:]).get("choices", [])
    return any(choice["delta"].get("content") for choice in choices)


def stream(
    client: httpx.Client,
    base_url: str,
    i: int,
    tokens: int,
    first: threading.Event | None = None,
    *,
    model: str,
) -> float:
    """Stream prompt `i` to its end; the seconds to its first content (`first` is set then)."""
    body = common.chat_body(model, messages(i), tokens, stream=True)
    ttft: float | None = None
    started = time.perf_counter()
    with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if ttft is None and _content(line):
                ttft = time.perf_counter() - started
                if first is not None:
                    first.set()
    if ttft is None:
        raise RuntimeError("the stream held no content")
    return ttft


def busy_ttft(
    pool: ThreadPoolExecutor,
    client: httpx.Client,
    base_url: str,
    parallel: int,
    tokens: int,
    model: str,
) -> float:
    """TTFT of the last prompt while `parallel - 1` others stream."""
    firsts = [threading.Event() for _ in range(parallel - 1)]
    background = [
        pool.submit(stream, client, base_url, i, 2 * tokens, first, model=model)
        for i, first in enumerate(firsts)
    ]
    try:
        if not all(first.wait(WAIT_S) for first in firsts):
            raise RuntimeError("a background stream sent no content")
        wait_for_slots(client, base_url, parallel - 1)
        return stream(client, base_url, parallel - 1, tokens, model=model)
    finally:
        for future in background:
            future.result()


def ttft_rounds(
    pool: ThreadPoolExecutor,
    client: httpx.Client,
    base_url: str,
    parallel: int,
    tokens: int,
    rounds: int,
    model: str,
) -> dict[str, list[float]]:
    """A warm-up of both, then `rounds` rounds whose order alternates."""
    paths = {
        "idle": partial(stream, client, base_url, parallel - 1, tokens, model=model),
        "busy": partial(busy_ttft, pool, client, base_url, parallel, tokens, model),
    }
    for measure_once in paths.values():
        measure_once()
    found: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(rounds):
        for name in names[i % 2 :] + names[: i % 2]:
            found[name].append(paths[name]())
            log.info("round %d TTFT %-4s %7.1f ms", i + 1, name, found[name][-1] * 1000)
    return found


def _counts(runs: Sequence[Batched], tokens: int) -> str:
    counts = sorted({row.tokens for run in runs for row in run.rows})
    flag = "" if counts == [tokens] else " (stopped early)"
    return "/".join(map(str, counts)) + flag


def rows_table(runs: Mapping[str, Sequence[Batched]], tokens: int, base: str) -> str:
    """Aggregate and per-row rates, with the ratio of aggregates to `base`."""
    base_rate = common.median_rate(runs[base])
    lines = [
        "| path | median aggregate tok/s | min | max | median per-row tok/s "
        f"| with prefill tok/s | median wall (s) | tokens per row | ratio to {base} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, found in runs.items():
        rates = [r.rate for r in found]
        per_row = statistics.median(row.rate for run in found for row in run.rows)
        prefilled = statistics.median(r.tokens / (r.seconds + r.prefill) for r in found)
        with_prefill = f"{prefilled:.1f}" if any(r.prefill for r in found) else "-"
        lines.append(
            f"| {name} | {statistics.median(rates):.1f} | {min(rates):.1f} | {max(rates):.1f} "
            f"| {per_row:.1f} | {with_prefill} "
            f"| {statistics.median(r.seconds for r in found):.2f} | {_counts(found, tokens)} "
            f"| {statistics.median(rates) / base_rate:.3f} |"
        )
    return "\n".join(lines) + "\n"


def ttft_table(ttft: Mapping[str, Sequence[float]], parallel: int) -> str:
    lines = ["| request | median TTFT (ms) | min | max |", "|---|---:|---:|---:|"]
    for name, found in ttft.items():
        ms = [s * 1000 for s in found]
        label = f"busy ({parallel - 1} streaming)" if name == "busy" else name
        lines.append(f"| {label} | {statistics.median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} |")
    return "\n".join(lines) + "\n"


def goal_row(name: str, value: float, goal: float, at_most: bool = False) -> str:
    """A goal's row: `value` against `goal`, a floor (or a ceiling, `at_most`)."""
    met = value <= goal if at_most else value >= goal
    mark = "" if met else (" (above)" if at_most else " (below)")
    shown = str(value) if isinstance(value, int) else f"{value:.3f}"
    return f"| {name} | {shown}{mark} | {'<=' if at_most else '>='} {goal} |"
