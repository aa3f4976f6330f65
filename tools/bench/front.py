"""A front end on the chat path against chat itself, on the default model, in one run.

The Responses (tools/bench/responses.py) and Messages (tools/bench/messages.py) APIs run
as the chat completion they describe; what they may cost is their shaping. One
`miserver serve` (no `--model`: the embedded GGUF on llama.cpp) on loopback; the same
greedy essay prompt (`peer.MESSAGES`) goes to chat and to the front end:

1. Decode. JSON, N tokens (the essay runs past N), timed until the whole body is in:
   tokens/s is output tokens over the request's wall time. Goal: front / chat >= 0.98.
2. Streamed TTFT. `stream: true`, 16 tokens, the time to the first text, the median of
   5 requests per path and round. Goal: front / chat <= 1.05.

Each pair runs in `common.mirrored` rounds (a warm-up each, the order swapped every
other round); a goal is the median over rounds of the within-round ratio
(`peer.goal_row`). The tables (markdown) go to stdout.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from miserver.settings import from_env
from tools.bench import common
from tools.bench.peer import MESSAGES, goal_row, paired, paired_ttft

MODEL = "SmolLM2-135M-Instruct:Q4_1"
DECODE_GOAL = 0.98
TTFT_GOAL = 1.05
TTFT_TOKENS = 16
TTFT_REQUESTS = 5


@dataclass(frozen=True, slots=True)
class Front:
    """A front end: its name, its route, one JSON request of N tokens, one streamed one of
    `TTFT_TOKENS` (its `ttft` the time to its first text)."""

    name: str
    route: str
    decode: Callable[[httpx.Client, str, int], common.Run]
    stream: Callable[[httpx.Client, str], common.Run]


def chat(client: httpx.Client, url: str, tokens: int) -> common.Run:
    return common.server_json(client, url, tokens, model=MODEL, messages=MESSAGES)


def chat_ttft(client: httpx.Client, url: str) -> common.Run:
    runs = [
        common.server_stream(client, url, TTFT_TOKENS, model=MODEL, messages=MESSAGES)
        for _ in range(TTFT_REQUESTS)
    ]
    return common.median_ttft(runs)


def measure(
    front: Front, rounds: int, tokens: int, threads: int | None, work: Path
) -> dict[str, list[Any]]:
    settings = from_env()
    extra = [] if threads is None else ["--threads", str(threads)]
    with (
        common.served(work / "gguf", settings.cache_dir, threads, extra) as url,
        httpx.Client(timeout=600.0) as client,
    ):
        decode: Mapping[str, Callable[[], common.Run]] = {
            "chat": partial(chat, client, url, tokens),
            front.name: partial(front.decode, client, url, tokens),
        }

        def front_ttft() -> common.Run:
            return common.median_ttft([front.stream(client, url) for _ in range(TTFT_REQUESTS)])

        firsts: Mapping[str, Callable[[], common.Run]] = {
            "chat ttft": partial(chat_ttft, client, url),
            f"{front.name} ttft": front_ttft,
        }
        runs = common.mirrored(decode, rounds)
        runs |= common.mirrored(firsts, rounds)
    return runs


def report(front: Front, runs: Mapping[str, Sequence[common.Run]], rounds: int, tokens: int) -> str:
    names = ("chat", front.name)
    same = all(a.text == b.text for a, b in zip(runs["chat"], runs[front.name], strict=True))
    rates = {name: statistics.median(r.rate for r in runs[name]) for name in names}
    ttfts = {n: statistics.median(r.ttft for r in runs[f"{n} ttft"]) for n in names}
    lines = [
        f"### {front.route} against /v1/chat/completions ({rounds} rounds, {tokens} tokens)",
        "",
        "| path | decode tok/s (median) | streamed TTFT ms (median) |",
        "| --- | --- | --- |",
        *(f"| {n} | {rates[n]:.1f} | {ttfts[n] * 1000:.1f} |" for n in names),
        "",
        f"The same text on both routes in every round: {'yes' if same else 'NO'}.",
        "",
        "| goal | median | middle half | rounds met | target |",
        "| --- | --- | --- | --- | --- |",
        goal_row(f"decode, {front.name} / chat", paired(runs, front.name, "chat"), DECODE_GOAL),
        goal_row(
            f"streamed TTFT, {front.name} / chat",
            paired_ttft(runs, f"{front.name} ttft", "chat ttft"),
            TTFT_GOAL,
            at_most=True,
        ),
    ]
    return "\n".join(lines)


def main(front: Front, doc: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix=f"bench-{front.name}-") as work:
        runs = measure(front, args.rounds, args.tokens, args.threads, Path(work))
    sys.stdout.write(report(front, runs, args.rounds, args.tokens) + "\n")
    return 0
