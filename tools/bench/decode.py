"""Decode speed through the server against bare `model.generate`, in one run.

    python -m tools.bench.decode [--rounds 5] [--tokens 128] [--threads N]

Three paths generate greedily from the same chat prompt (rendered with the
model's chat template, the same token ids everywhere):

- `bare`: `model.generate(do_sample=False, max_new_tokens=N)` in this
  process, on the model miserver's transformers engine loads (the converted
  HF folder in the cache directory);
- `server`: `POST /v1/chat/completions` to `miserver serve` (a uvicorn
  subprocess on loopback), timed until the whole JSON body is in;
- `server-stream`: the same request with `stream: true`, timed until
  `data: [DONE]`.

Rounds are interleaved (the order rotates every round) so that a change in
machine load hits every path alike. Tokens/s is the completion tokens the
path reports (bare: the new ids) over the wall time of the request, prefill
included. The prompt asks for an essay that runs past N tokens greedily; a
path that stops early is flagged. The table (markdown) goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import torch

from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.decode")

MODEL_ID = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
Run = common.Run


@contextlib.contextmanager
def served(data_dir: Path, cache_dir: Path, threads: int | None) -> Iterator[str]:
    """`miserver serve --model SmolLM2-135M-Instruct` on a free loopback port; yields /v1."""
    with common.served(data_dir, cache_dir, threads, ["--model", MODEL_ID]) as base_url:
        yield base_url


# -- bare transformers ---------------------------------------------------------------


def bare(engine: TransformersEngine, prompt_ids: list[int], tokens: int) -> Run:
    model = engine.model
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=tokens,
            pad_token_id=engine.tokenizer.eos_token_id,
        )
    seconds = time.perf_counter() - started
    new_ids = output[0, len(prompt_ids) :].tolist()
    return Run(len(new_ids), seconds, engine.decode(new_ids))


# -- the run -------------------------------------------------------------------------


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    settings = from_env()
    engine = load_transformers_engine(
        embedded_default(), model_id=MODEL_ID, cache_dir=settings.cache_dir
    )
    prompt_ids = engine.render_chat(ChatPrompt(MESSAGES))
    with (
        served(work / "data", settings.cache_dir, threads) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):
        paths: dict[str, Callable[[], Run]] = {
            "bare": lambda: bare(engine, prompt_ids, tokens),
            "server": lambda: common.server_json(
                client, base_url, tokens, model=MODEL_ID, messages=MESSAGES
            ),
            "server-stream": lambda: common.server_stream(
                client, base_url, tokens, model=MODEL_ID, messages=MESSAGES
            ),
        }
        runs = common.interleave(paths, rounds)
    engine.close()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for both (default: torch's)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.rounds, args.tokens, args.threads, Path(work))
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {args.rounds} rounds of {args.tokens} greedy tokens\n\n"
    )
    sys.stdout.write(common.table(runs, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
