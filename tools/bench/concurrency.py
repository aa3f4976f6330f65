"""Continuous batching on llama.cpp: k rows decoded together, bare and through `miserver serve`.

    python -m tools.bench.concurrency [--rounds 3] [--tokens 128] [--threads N]
        [--parallel 8] [--overload] [--engine llama.cpp|transformers]

(`--engine transformers` runs `tools/bench/transformers_rows.py`.)

Eight chat prompts ("Write a long story about <topic>.", rendered with the
file's chat template by miserver's llama.cpp engine: the same token ids
everywhere) on SmolLM2-135M-Instruct Q4_1, miserver's embedded default:

- `bare k=1` / `bare k=8`: llama.cpp's batch API driven from this process,
  no miserver code and no `create_completion`: a second context over the
  loaded model with `--parallel` sequences (`n_seq_max`, each its own KV
  stream, a share of the file's trained window, `kv_unified` off, as `serve
  --parallel` makes it). Each run clears the KV, prefills k prompts one by
  one on sequences 0..k-1 (each picks its first token), then takes
  `--tokens` greedy steps: one `llama_decode` of k rows, one greedy pick per
  row. EOS is ignored, so every row makes `--tokens` tokens. Aggregate tok/s
  is k x tokens over the steps' seconds; `with prefill` counts the prefill.
- `server C=1,2,4,8`: `miserver serve --parallel 8` (a subprocess on
  loopback, model `SmolLM2-135M-Instruct:Q4_1`). C clients at once, each one
  greedy `POST /v1/chat/completions` (`max_tokens` = `--tokens`) of its own
  prompt. miserver has no ignore_eos: long stories run past 128 tokens
  greedily, and the table shows the completion tokens made. Aggregate tok/s
  is their sum over the round's wall time; per-client, each request's own.
- TTFT: a streamed request (the 8th prompt) on the idle server, against the
  same request while 7 others stream (`max_tokens` twice `--tokens`: 256;
  each past its first chunk, `/api/health/inference` showing 7 slots in
  use), so that it takes the batch's last row (an 8th would queue behind
  it). TTFT: sending to the first chunk with content. Its prompt was served
  before (the warm-up), so both reuse the kept KV prefix.
- `--overload` (60 s more, off by default): 64 clients for 60 s, each
  looping 64-token chats (after a 503 it waits its Retry-After). Counts of
  200, 503 (and 503s without Retry-After) and anything else; tokens served
  per second (200s' completion tokens over the time until the last reply)
  against the C=8 aggregate; the server's RSS before and after.

Bare and server rounds are interleaved in one rotation (`common.interleave`,
after a warm-up of every path), then the TTFT rounds. Tables (markdown) go
to stdout, with the goals: server C=8 / C=1 >= 0.85 x bare k=8 / k=1; TTFT
busy / idle <= 3; under overload nothing but 200 and 503 (each with
Retry-After), served tok/s >= 0.8 x C=8 aggregate, RSS drift <= 5 %.

llama.cpp decodes one token on `n_threads` and a batch of rows on
`n_threads_batch` (llama-cpp-python's defaults: half the CPUs, all of them),
so on a machine shared with other work pass `--threads` (both, bare and
server): spinning threads that wait for a busy core slow k > 1 the most.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import llama_cpp

from miserver.engines import gguf
from miserver.engines.base import ChatPrompt
from miserver.engines.llamacpp import load_llamacpp_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env

try:
    from tools.bench import common
    from tools.bench.bare_batch import Batched, bare_engine, bare_rows
    from tools.bench.overload import (
        OVERLOAD_CLIENTS,
        OVERLOAD_SECONDS,
        OVERLOAD_TOKENS,
        Overload,
        overload,
    )
except ModuleNotFoundError:  # run as a script: python tools/bench/concurrency.py
    import common  # type: ignore[no-redef]
    from bare_batch import Batched, bare_engine, bare_rows  # type: ignore[no-redef]
    from overload import (  # type: ignore[no-redef]
        OVERLOAD_CLIENTS,
        OVERLOAD_SECONDS,
        OVERLOAD_TOKENS,
        Overload,
        overload,
    )

log = logging.getLogger("bench.concurrency")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
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

Run = common.Run


def messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}]


def _overload_body(i: int) -> dict[str, Any]:
    return common.chat_body(MODEL_ID, messages(i), OVERLOAD_TOKENS, stream=False)


def render(path: Path, count: int) -> list[list[int]]:
    """The first `count` prompts' ids, rendered by miserver's llama.cpp engine."""
    engine = load_llamacpp_engine(path, model_id=MODEL_ID)
    try:
        return [engine.render_chat(ChatPrompt(messages(i))) for i in range(count)]
    finally:
        engine.close()


# -- the server ------------------------------------------------------------------------


def clients(
    pool: ThreadPoolExecutor, client: httpx.Client, base_url: str, tokens: int, count: int
) -> Batched:
    """`count` chats at once, one prompt each; the aggregate over the round's wall time."""
    started = time.perf_counter()
    futures = [
        pool.submit(
            common.server_json, client, base_url, tokens, model=MODEL_ID, messages=messages(i)
        )
        for i in range(count)
    ]
    rows = tuple(f.result() for f in futures)
    seconds = time.perf_counter() - started
    return Batched(sum(r.tokens for r in rows), seconds, rows[0].text, rows=rows)


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
    model: str = MODEL_ID,
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
    model: str = MODEL_ID,
) -> float:
    """TTFT of the last prompt while `parallel - 1` others stream."""
    firsts = [threading.Event() for _ in range(parallel - 1)]
    background = [
        pool.submit(stream, client, base_url, i, 2 * tokens, first, model)
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
    model: str = MODEL_ID,
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


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Results:
    runs: dict[str, list[Batched]]
    ttft: dict[str, list[float]]
    overload: Overload | None
    backend: str


def client_counts(parallel: int) -> list[int]:
    counts = [c for c in (1, 2, 4, 8, 16, 32, 64) if c < parallel]
    return [*counts, parallel]


def measure(args: argparse.Namespace, work: Path) -> Results:
    path = embedded_default()
    window = gguf.facts(path).context_length
    prompts = render(path, args.parallel)
    serve = ["--parallel", str(args.parallel)]
    serve += [] if args.threads is None else ["--threads", str(args.threads)]
    cache_dir = from_env().cache_dir
    with (
        bare_engine(path, window, args.threads, args.parallel) as bare,
        common.served_process(work / "data", cache_dir, args.threads, serve) as (base_url, server),
        httpx.Client(timeout=600.0) as client,
        ThreadPoolExecutor(max_workers=args.parallel) as pool,
    ):
        state = health(client, base_url)
        backend = f"{state['backend']}, parallel {state['parallel']}"
        paths = {
            f"bare k={k}": partial(bare_rows, bare, prompts[:k], args.tokens)
            for k in (1, args.parallel)
        }
        for count in client_counts(args.parallel):
            paths[f"server C={count}"] = partial(
                clients, pool, client, base_url, args.tokens, count
            )
        runs = cast(dict[str, list[Batched]], common.interleave(paths, args.rounds))
        ttft = ttft_rounds(pool, client, base_url, args.parallel, args.tokens, args.rounds)
        loaded = overload(base_url, server.pid, _overload_body) if args.overload else None
    return Results(runs, ttft, loaded, backend)


# -- tables ----------------------------------------------------------------------------


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


def overload_table(loaded: Overload) -> str:
    tally = loaded.tally
    other = ", ".join(f"{k}: {v}" for k, v in sorted(tally.other.items())) or "0"
    rows = [
        ("clients x seconds", f"{OVERLOAD_CLIENTS} x {OVERLOAD_SECONDS:.0f}"),
        ("wall until the last reply (s)", f"{loaded.seconds:.1f}"),
        ("200", str(tally.ok)),
        ("503", str(tally.refused)),
        ("503 without Retry-After", str(tally.without_retry_after)),
        ("other", other),
        ("completion tok/s served", f"{loaded.rate:.1f}"),
        (
            "server RSS start / end (MiB)",
            f"{loaded.rss_start / 2**20:.0f} / {loaded.rss_end / 2**20:.0f}",
        ),
        ("RSS drift", f"{loaded.drift * 100:+.1f} %"),
    ]
    lines = ["| overload | value |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines) + "\n"


def goal_row(name: str, value: float, goal: float, at_most: bool = False) -> str:
    """A goal's row: `value` against `goal`, a floor (or a ceiling, `at_most`)."""
    met = value <= goal if at_most else value >= goal
    mark = "" if met else (" (above)" if at_most else " (below)")
    shown = str(value) if isinstance(value, int) else f"{value:.3f}"
    return f"| {name} | {shown}{mark} | {'<=' if at_most else '>='} {goal} |"


def goals(results: Results, parallel: int) -> str:
    med = {name: common.median_rate(found) for name, found in results.runs.items()}
    server = med[f"server C={parallel}"] / med["server C=1"]
    bare = med[f"bare k={parallel}"] / med["bare k=1"]
    ttft = {name: statistics.median(found) for name, found in results.ttft.items()}
    lines = [
        "| goal | value | target |",
        "|---|---:|---:|",
        f"| server C={parallel} / C=1 | {server:.3f} | |",
        f"| bare k={parallel} / k=1 | {bare:.3f} | |",
        goal_row("(server ratio) / (bare ratio)", server / bare, 0.85),
        goal_row("TTFT busy / idle (medians)", ttft["busy"] / ttft["idle"], 3.0, at_most=True),
    ]
    loaded = results.overload
    if loaded is not None:
        tally = loaded.tally
        lines += [
            goal_row("overload: statuses not 200/503", sum(tally.other.values()), 0, at_most=True),
            goal_row("overload: 503s without Retry-After", tally.without_retry_after, 0, True),
            goal_row(
                f"overload tok/s / server C={parallel}",
                loaded.rate / med[f"server C={parallel}"],
                0.8,
            ),
            goal_row("overload RSS drift", loaded.drift, 0.05, at_most=True),
        ]
    return "\n".join(lines) + "\n"


def report(results: Results, args: argparse.Namespace) -> str:
    runs = results.runs
    bare = {name: found for name, found in runs.items() if name.startswith("bare")}
    server = {name: found for name, found in runs.items() if name.startswith("server")}
    threads = args.threads or "llama-cpp-python's default"
    parts = [
        f"llama-cpp-python {llama_cpp.__version__}, threads: {threads}, {os.cpu_count()} CPUs, "
        f"server: {results.backend}; {args.rounds} rounds of {args.tokens} greedy tokens\n",
        rows_table(bare, args.tokens, "bare k=1"),
        rows_table(server, args.tokens, "server C=1"),
        ttft_table(results.ttft, args.parallel),
    ]
    if results.overload is not None:
        parts.append(overload_table(results.overload))
    return "\n".join([*parts, goals(results, args.parallel)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="prefill and decode threads, bare and server (default: llama-cpp-python's)",
    )
    parser.add_argument("--parallel", type=int, default=8, help="rows: bare k and serve --parallel")
    parser.add_argument(
        "--overload", action="store_true", help=f"{OVERLOAD_CLIENTS} clients for 60 s more"
    )
    parser.add_argument(
        "--engine",
        choices=["llama.cpp", "transformers"],
        default="llama.cpp",
        help="transformers: tools/bench/transformers_rows.py, with these options",
    )
    args = parser.parse_args(argv)
    if args.engine == "transformers":
        from tools.bench import transformers_rows  # it imports this module

        return transformers_rows.main(
            [f"--rounds={args.rounds}", f"--tokens={args.tokens}", f"--parallel={args.parallel}"]
            + ([] if args.threads is None else [f"--threads={args.threads}"])
        )
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        results = measure(args, Path(work))
    sys.stdout.write(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
