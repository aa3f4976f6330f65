"""What the Responses API costs over chat, on the default model, in one run (issue 44).

    python -m tools.bench.responses [--rounds 7] [--tokens 256] [--threads N]

One `miserver serve` (no `--model`: the embedded GGUF on llama.cpp) on loopback.
The same greedy essay prompt (`peer.MESSAGES`) goes to both routes:

1. Decode. JSON, `max_tokens` / `max_output_tokens` N, `ignore_eos`-free (the
   essay runs past N tokens), timed until the whole body is in: tokens/s is
   output tokens over the request's wall time. Goal: responses / chat >= 0.98.
2. Streamed TTFT. `stream: true`, 16 tokens, the time to the first text (the
   first `delta.content` chunk on chat, the first `response.output_text.delta`
   event on responses), the median of 5 requests per path and round. Goal:
   responses / chat <= 1.05.

Each pair runs in `common.mirrored` rounds (a warm-up each, the order swapped every
other round); a goal is the median over rounds of the within-round ratio
(`peer.goal_row`). The tables (markdown) go to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from miserver.settings import from_env
from tools.bench import common
from tools.bench.peer import MESSAGES, goal_row, paired, paired_ttft

log = logging.getLogger(__name__)

MODEL = "SmolLM2-135M-Instruct:Q4_1"
DECODE_GOAL = 0.98
TTFT_GOAL = 1.05
TTFT_TOKENS = 16
TTFT_REQUESTS = 5
PROMPT = MESSAGES[0]["content"]


def chat(client: httpx.Client, url: str, tokens: int) -> common.Run:
    return common.server_json(client, url, tokens, model=MODEL, messages=MESSAGES)


def response(client: httpx.Client, url: str, tokens: int) -> common.Run:
    body = {"model": MODEL, "input": PROMPT, "max_output_tokens": tokens, "temperature": 0}
    body["store"] = False  # as chat keeps nothing
    started = time.perf_counter()
    reply = client.post(f"{url}/responses", json=body)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    found = reply.json()
    text = "".join(
        part["text"]
        for item in found["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    return common.Run(found["usage"]["output_tokens"], seconds, text)


def chat_ttft(client: httpx.Client, url: str) -> common.Run:
    runs = [
        common.server_stream(client, url, TTFT_TOKENS, model=MODEL, messages=MESSAGES)
        for _ in range(TTFT_REQUESTS)
    ]
    return common.median_ttft(runs)


def response_ttft(client: httpx.Client, url: str) -> common.Run:
    return common.median_ttft([_response_stream(client, url) for _ in range(TTFT_REQUESTS)])


def _response_stream(client: httpx.Client, url: str) -> common.Run:
    body = {
        "model": MODEL,
        "input": PROMPT,
        "max_output_tokens": TTFT_TOKENS,
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    parts: list[str] = []
    ttft, tokens = 0.0, 0
    started = time.perf_counter()
    with client.stream("POST", f"{url}/responses", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta":
                ttft = ttft or time.perf_counter() - started
                parts.append(event["delta"])
            elif event["type"] in ("response.completed", "response.incomplete"):
                tokens = event["response"]["usage"]["output_tokens"]
    return common.Run(tokens, time.perf_counter() - started, "".join(parts), ttft)


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Any]]:
    settings = from_env()
    extra = [] if threads is None else ["--threads", str(threads)]
    with (
        common.served(work / "gguf", settings.cache_dir, threads, extra) as url,
        httpx.Client(timeout=600.0) as client,
    ):
        decode: Mapping[str, Callable[[], common.Run]] = {
            "chat": partial(chat, client, url, tokens),
            "responses": partial(response, client, url, tokens),
        }
        firsts: Mapping[str, Callable[[], common.Run]] = {
            "chat ttft": partial(chat_ttft, client, url),
            "responses ttft": partial(response_ttft, client, url),
        }
        runs = common.mirrored(decode, rounds)
        runs |= common.mirrored(firsts, rounds)
    return runs


def report(runs: Mapping[str, Sequence[common.Run]], rounds: int, tokens: int) -> str:
    same = all(a.text == b.text for a, b in zip(runs["chat"], runs["responses"], strict=True))
    rates = {name: statistics.median(r.rate for r in runs[name]) for name in ("chat", "responses")}
    ttfts = {n: statistics.median(r.ttft for r in runs[f"{n} ttft"]) for n in ("chat", "responses")}
    lines = [
        f"### /v1/responses against /v1/chat/completions ({rounds} rounds, {tokens} tokens)",
        "",
        "| path | decode tok/s (median) | streamed TTFT ms (median) |",
        "| --- | --- | --- |",
        *(f"| {n} | {rates[n]:.1f} | {ttfts[n] * 1000:.1f} |" for n in ("chat", "responses")),
        "",
        f"The same text on both routes in every round: {'yes' if same else 'NO'}.",
        "",
        "| goal | median | middle half | rounds met | target |",
        "| --- | --- | --- | --- | --- |",
        goal_row("decode, responses / chat", paired(runs, "responses", "chat"), DECODE_GOAL),
        goal_row(
            "streamed TTFT, responses / chat",
            paired_ttft(runs, "responses ttft", "chat ttft"),
            TTFT_GOAL,
            at_most=True,
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as work:
        runs = measure(args.rounds, args.tokens, args.threads, Path(work))
    sys.stdout.write(report(runs, args.rounds, args.tokens) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
