"""An evaluation's scoring with the prompt cache against without it, in one run (issue 43).

    python -m tools.bench.scoring_cache [--rounds 5] [--shots 16] [--questions 12]
        [--model SmolLM2-135M-Instruct:Q4_1] [--threads N]

Two `miserver serve` processes on loopback, side by side, the model given (the embedded
default GGUF on llama.cpp unless `--model` names another): `cache` with `--scoring-cache`,
`whole` without (the default). An evaluation's workload, as lm-evaluation-harness sends
it: one few-shot context of `--shots` question-answer pairs, then each of `--questions`
questions after it, scored one after another (`POST /v1/completions`, `max_tokens: 1`,
`logprobs: 5`, `temperature: 0`), each request timed until its whole body is in. A round
scores every question on both servers, mirrored (`common.mirrored`), after a warm-up
round that fills the cache; each round's questions are new, so only the context repeats.

Reported: the median milliseconds a question, `cache` / `whole`, the prompt tokens and
the median `cached_tokens`; and how far apart the two servers' log-probabilities of the
same question's top tokens are (the cache's float noise: on a quantized GGUF, llama.cpp's
batch-shape noise).
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

from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.scoring_cache")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
PAIRS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Canada", "Ottawa"),
    ("Egypt", "Cairo"),
    ("Norway", "Oslo"),
    ("Chile", "Santiago"),
    ("India", "New Delhi"),
    ("Spain", "Madrid"),
    ("Ghana", "Accra"),
    ("Italy", "Rome"),
    ("Cuba", "Havana"),
    ("Iran", "Tehran"),
    ("Fiji", "Suva"),
    ("Laos", "Vientiane"),
]
ASKED = [
    "Poland", "Brazil", "Mexico", "Greece", "Sweden", "Turkey", "Nepal", "Kenya", "Oman",
    "Chad", "Mali", "Togo", "Iraq", "Cyprus", "Malta", "Qatar", "Benin", "Gabon", "Niger",
    "Haiti", "Peru", "Samoa", "Tonga", "Yemen", "Libya", "Sudan", "Syria", "Jordan",
    "Israel", "Ukraine", "Latvia", "Estonia", "Austria", "Belgium", "Denmark", "Finland",
]  # fmt: skip


def context(shots: int) -> str:
    return "".join(
        f"Q: What is the capital of {country}?\nA: {capital}\n\n"
        for country, capital in itertools.islice(itertools.cycle(PAIRS), shots)
    )


def score(
    client: httpx.Client, url: str, model: str, prompt: str, seen: list[dict[str, Any]]
) -> common.Run:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "logprobs": 5, "temperature": 0}
    started = time.perf_counter()
    response = client.post(f"{url}/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    found = response.json()
    seen.append(found)
    return common.Run(1, seconds, "")


def questions(args: argparse.Namespace, shots: str) -> list[list[str]]:
    """Each round's questions (the warm-up's first): new questions every round."""
    asked = zip(itertools.count(), itertools.cycle(ASKED))
    return [
        [
            f"{shots}Q: In {1900 + k}, what was the capital of {country}?\nA:"
            for k, country in itertools.islice(asked, args.questions)
        ]
        for _ in range(args.rounds + 1)
    ]


def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[common.Run]], Any]:
    cache_dir = from_env().cache_dir
    extra = [] if args.threads is None else ["--threads", str(args.threads)]
    model = ["--model", args.model] if args.model != MODEL_ID else []
    rounds = questions(args, context(args.shots))
    seen: dict[str, list[dict[str, Any]]] = {"cache": [], "whole": []}
    with (
        common.served(
            work / "c", cache_dir, args.threads, [*extra, *model, "--scoring-cache"]
        ) as cached,
        common.served(work / "w", cache_dir, args.threads, [*extra, *model]) as whole,
        httpx.Client(timeout=600.0) as client,
    ):
        urls = {"cache": cached, "whole": whole}
        turn = itertools.count()

        def path(name: str) -> Callable[[], common.Run]:
            def run() -> common.Run:
                prompts = rounds[next(turn) // 2]
                runs = [score(client, urls[name], args.model, p, seen[name]) for p in prompts]
                return common.Run(len(runs), statistics.median(r.seconds for r in runs), "")

            return run

        runs = common.mirrored({"cache": path("cache"), "whole": path("whole")}, args.rounds)
    return runs, seen


def _top(reply: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = reply["choices"][0]["logprobs"]["top_logprobs"][0]
    return found


def report(runs: dict[str, list[common.Run]], seen: Any, args: argparse.Namespace) -> str:
    median = {name: statistics.median(r.seconds for r in found) for name, found in runs.items()}
    ratios = [c.seconds / w.seconds for c, w in zip(runs["cache"], runs["whole"], strict=True)]
    first = args.questions  # the warm-up round's replies are left out
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in seen["cache"][first:]]
    prompt = seen["whole"][first]["usage"]["prompt_tokens"]
    gaps = [
        abs(_top(c)[token] - value)
        for c, w in zip(seen["cache"][first:], seen["whole"][first:], strict=True)
        for token, value in _top(w).items()
        if token in _top(c)
    ]
    return "\n".join(
        [
            f"{args.model}: {args.shots}-shot context, {args.questions} questions a round, "
            f"{args.rounds} mirrored rounds; {prompt} prompt tokens a question",
            "",
            "| server | median ms a question | cached tokens (median) |",
            "|---|---:|---:|",
            f"| cache (`--scoring-cache`) | {median['cache'] * 1e3:.1f} | "
            f"{statistics.median(cached):.0f} |",
            f"| whole (the default) | {median['whole'] * 1e3:.1f} | 0 |",
            "",
            f"cache / whole, median of the rounds' ratios: **{statistics.median(ratios):.3f}**; "
            f"the top tokens' log-probabilities apart by at most {max(gaps):.4f} nats "
            f"(median {statistics.median(gaps):.4f}) over {len(gaps)} pairs",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shots", type=int, default=16)
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--model", default=MODEL_ID)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        runs, seen = measure(args, Path(tmp))
    sys.stdout.write(report(runs, seen, args) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
