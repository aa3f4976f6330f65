"""Decide with a reused prefix against a cold one, through the server, in one run.

    python -m tools.bench.decide [--rounds 7] [--words 760] [--threads N]

`POST /api/decide` to `miserver serve --model SmolLM2-135M-Instruct` (a
subprocess on loopback) with a prefix of about 1k tokens and a short
question as the suffix (a fresh one every call):

- `cold`: `reuse_prefix: false`, the whole prompt prefilled;
- `reused`: `reuse_prefix: true`, the state after the prefix restored, only
  the suffix and the template's tail prefilled.

Rounds are interleaved; the table gives median milliseconds per decision
(HTTP included) and `reused / cold` (goal <= 0.3), with the token counts the
server reports.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.decide")

MODEL_ID = "SmolLM2-135M-Instruct"
TEXT = [
    "The",
    "assistant",
    "reviews",
    "a",
    "long",
    "record",
    "of",
    "actions,",
    "screens",
    "and",
    "notes",
    "before",
    "it",
    "picks",
    "the",
    "next",
    "step,",
    "and",
    "it",
    "must",
    "weigh",
    "every",
    "earlier",
    "observation",
    "carefully.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--words", type=int, default=760)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    prefix = " ".join(TEXT[i % len(TEXT)] for i in range(args.words))
    counter = itertools.count()
    settings = from_env()
    answers: dict[str, list[dict[str, Any]]] = {"cold": [], "reused": []}
    times: dict[str, list[float]] = {"cold": [], "reused": []}
    with (
        tempfile.TemporaryDirectory(prefix="bench-decide-") as tmp,
        common.served(
            Path(tmp) / "data", settings.cache_dir, args.threads, ["--model", MODEL_ID]
        ) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):
        url = base_url.removesuffix("/v1") + "/api/decide"

        def run(name: str, reuse: bool) -> Callable[[], None]:
            def call() -> None:
                body = {
                    "prefix": prefix,
                    "suffix": f"\nStep {next(counter)}: continue? Answer yes or no.",
                    "choices": ["yes", "no"],
                    "reuse_prefix": reuse,
                }
                started = time.perf_counter()
                response = client.post(url, json=body)
                times[name].append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                answers[name].append(response.json())

            return call

        paths = {"cold": run("cold", False), "reused": run("reused", True)}
        for fn in paths.values():
            fn()  # warm-up (and the first kept prefix)
        for values in (*times.values(), *answers.values()):
            values.clear()
        names = list(paths)
        for i in range(args.rounds):
            for name in names[i % 2 :] + names[: i % 2]:
                paths[name]()
                log.info("round %d %-6s %7.1f ms", i + 1, name, times[name][-1])
    lines = [
        "| path | median ms | min | max | tokens | reused | prefilled |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, found in times.items():
        last = answers[name][-1]
        lines.append(
            f"| {name} | {statistics.median(found):.1f} | {min(found):.1f} | {max(found):.1f} "
            f"| {last['n_tokens']} | {last['n_reused']} | {last['n_prefilled']} |"
        )
    ratio = statistics.median(times["reused"]) / statistics.median(times["cold"])
    sys.stdout.write(
        f"torch {torch.__version__}, {args.rounds} rounds\n\n"
        + "\n".join(lines)
        + f"\n\nreused / cold (medians): {ratio:.3f}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
