"""Time to first token over a ~1k-token chat history: cold against a 2nd turn, in one run.

    python -m tools.bench.ttft [--rounds 5] [--turns 5] [--threads N]

Each round sends two streamed greedy requests to `miserver serve --model
SmolLM2-135M-Instruct` (a subprocess on loopback, `common.served`):

- `cold`: a history (`--turns` user/assistant pairs, ~1k tokens) that no
  earlier request shared: its first message names the round, so the KV
  cache holds only the template's opening of it;
- `2nd turn`: the same history, plus the cold request's answer and one more
  user message, which the kept KV cache can serve all but the new tail of.

TTFT is the time from sending the request to the first chunk with content.
A warm-up round is not counted. The table (markdown) goes to stdout, with
the ratio of the medians, 2nd turn over cold (the goal is <= 0.25).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.ttft")

MODEL_ID = "SmolLM2-135M-Instruct"

FACT = "The Roman Republic grew from a small city state into a power that ruled the sea. "
TOKENS = 8


@dataclass(frozen=True, slots=True)
class Reply:
    """One streamed answer: its TTFT, its text and the usage the server reported."""

    ttft: float
    text: str
    prompt_tokens: int
    cached_tokens: int


def history(round_: int, turns: int) -> list[dict[str, Any]]:
    """A chat that differs from every other round's from its first user message on."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        ask = f"Round {round_}, fact {turn}: tell me about Rome. " + FACT * 5
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": FACT * 5}]
    return [*messages, {"role": "user", "content": "Summarise all of that."}]


def ask(client: httpx.Client, base_url: str, messages: list[dict[str, Any]], model: str) -> Reply:
    body = common.chat_body(model, messages, TOKENS, stream=True)
    body["stream_options"] = {"include_usage": True}
    parts: list[str] = []
    ttft: float | None = None
    usage: dict[str, Any] = {}
    started = time.perf_counter()
    with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                content = choice["delta"].get("content") or ""
                if content and ttft is None:
                    ttft = time.perf_counter() - started
                parts.append(content)
            usage = chunk.get("usage") or usage
    if ttft is None:
        raise RuntimeError("the stream held no content")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Reply(ttft, "".join(parts), usage.get("prompt_tokens", 0), cached)


def one_round(
    client: httpx.Client, base_url: str, round_: int, turns: int, model: str
) -> dict[str, Reply]:
    first = history(round_, turns)
    cold = ask(client, base_url, first, model)
    follow = [
        *first,
        {"role": "assistant", "content": cold.text},
        {"role": "user", "content": "Shorter."},
    ]
    return {"cold": cold, "2nd turn": ask(client, base_url, follow, model)}


def measure(
    rounds: int, turns: int, threads: int | None, work: Path, model: str = MODEL_ID
) -> dict[str, list[Reply]]:
    settings = from_env()
    runs: dict[str, list[Reply]] = {"cold": [], "2nd turn": []}
    with (
        common.served(work / "data", settings.cache_dir, threads, ["--model", model]) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):
        one_round(client, base_url, 0, turns, model)  # warm-up, not counted
        for i in range(1, rounds + 1):
            for name, reply in one_round(client, base_url, i, turns, model).items():
                runs[name].append(reply)
                log.info("round %d %-8s TTFT %7.1f ms", i, name, reply.ttft * 1000)
    return runs


def table(runs: dict[str, list[Reply]]) -> str:
    lines = [
        "| request | median TTFT (ms) | min | max | prompt tokens | cached tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, replies in runs.items():
        ms = [r.ttft * 1000 for r in replies]
        lines.append(
            f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} "
            f"| {statistics.median(r.prompt_tokens for r in replies):.0f} "
            f"| {statistics.median(r.cached_tokens for r in replies):.0f} |"
        )
    ratio = statistics.median(r.ttft for r in runs["2nd turn"]) / statistics.median(
        r.ttft for r in runs["cold"]
    )
    return "\n".join(lines) + f"\n\nratio 2nd turn / cold (medians): {ratio:.3f}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=5, help="user/assistant pairs (~200 tokens)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the server")
    parser.add_argument(
        "--model",
        default=MODEL_ID,
        help=f"model id (default {MODEL_ID}; the GGUF is {MODEL_ID}:Q4_1)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.rounds, args.turns, args.threads, Path(work), args.model)
    threads = args.threads or "the server's default"
    sys.stdout.write(
        f"torch {torch.__version__}, threads: {threads}, {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds, {TOKENS} greedy tokens per request\n\n"
    )
    sys.stdout.write(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
