"""Scoring latency through the server against a bare forward of the same tokens, in one run.

    python -m tools.bench.scoring [--rounds 9] [--words 300] [--threads N]

- `bare`: `model(input_ids)` in this process (torch.inference_mode, no KV
  cache kept, `logits_to_keep=1`), on the model miserver's transformers
  engine loads, then `log_softmax` of the last position;
- `server`: `POST /v1/completions` to `miserver serve --model
  SmolLM2-135M-Instruct` (a subprocess on loopback) with `max_tokens: 1`,
  `logprobs: 5`, timed until the whole JSON body is in;
- `server-allowed`: the same with `allowed_token_ids` (three ids) instead.

The prompt is a judge-style text of `--words` words (about 1.3 tokens a
word), the same ids on every path (the server's `usage.prompt_tokens` is
checked against them). Rounds are interleaved; the table gives median
milliseconds and the ratio to `bare` (goal <= 1.1).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from miserver.engines.transformers import load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.scoring")

MODEL_ID = "SmolLM2-135M-Instruct"
WORDS = [
    "the",
    "claim",
    "under",
    "review",
    "states",
    "that",
    "the",
    "committee",
    "met",
    "twice",
    "and",
    "approved",
    "the",
    "budget",
]


def judge_prompt(words: int) -> str:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return f"[context] {body}\n[question] Is the claim supported?\n[options] yes no\n[answer]:"


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = from_env()
    engine = load_transformers_engine(
        embedded_default(), model_id=MODEL_ID, cache_dir=settings.cache_dir
    )
    prompt = judge_prompt(args.words)
    ids = engine.tokenize(prompt)
    yes, no = (engine.tokenize(w, add_special_tokens=False)[0] for w in (" yes", " no"))
    allowed = [yes, no, 42]

    def bare() -> None:
        with torch.inference_mode():
            out = engine.model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)
            torch.log_softmax(out.logits[0, -1].double(), -1)

    with (
        tempfile.TemporaryDirectory(prefix="bench-scoring-") as tmp,
        common.served(
            Path(tmp) / "data", settings.cache_dir, args.threads, ["--model", MODEL_ID]
        ) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):

        def server(**extra: object) -> None:
            body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 1, **extra}
            response = client.post(f"{base_url}/completions", json=body)
            response.raise_for_status()
            if response.json()["usage"]["prompt_tokens"] != len(ids):
                raise RuntimeError("the server scored other token ids")

        paths: dict[str, Callable[[], None]] = {
            "bare": bare,
            "server": lambda: server(logprobs=5),
            "server-allowed": lambda: server(allowed_token_ids=allowed, logprobs=3),
        }
        for fn in paths.values():
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in paths}
        names = list(paths)
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                times[name].append(timed(paths[name]))
    engine.close()
    base = statistics.median(times["bare"])
    lines = ["| path | median ms | min | max | ratio to bare |", "|---|---:|---:|---:|---:|"]
    for name, found in times.items():
        median = statistics.median(found)
        lines.append(
            f"| {name} | {median:.1f} | {min(found):.1f} | {max(found):.1f} | {median / base:.3f} |"
        )
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads in this process, "
        f"{args.rounds} rounds, a {len(ids)}-token prompt\n\n" + "\n".join(lines) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
