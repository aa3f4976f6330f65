"""Continuous batching on llama.cpp: k rows decoded together, bare and through `miserver serve`.

    python -m tools.bench.concurrency [--rounds 3] [--tokens 128] [--threads N]
        [--parallel 8] [--overload]

(The same on transformers: `python -m tools.bench.transformers_rows`. The prompts, the
TTFT rounds and the tables both use are in `tools/bench/rows.py`.)

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
import logging
import os
import statistics
import sys
import tempfile
import time
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
from tools.bench import common
from tools.bench.bare_batch import Batched, bare_engine, bare_rows
from tools.bench.overload import (
    OVERLOAD_CLIENTS,
    OVERLOAD_SECONDS,
    OVERLOAD_TOKENS,
    Overload,
    overload,
)
from tools.bench.rows import (
    client_counts,
    goal_row,
    health,
    messages,
    rows_table,
    ttft_rounds,
    ttft_table,
)

log = logging.getLogger("bench.concurrency")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"

Run = common.Run


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


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Results:
    runs: dict[str, list[Batched]]
    ttft: dict[str, list[float]]
    overload: Overload | None
    backend: str


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
        ttft = ttft_rounds(
            pool, client, base_url, args.parallel, args.tokens, args.rounds, MODEL_ID
        )
        loaded = overload(base_url, server.pid, _overload_body) if args.overload else None
    return Results(runs, ttft, loaded, backend)


# -- tables ----------------------------------------------------------------------------


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        results = measure(args, Path(work))
    sys.stdout.write(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
