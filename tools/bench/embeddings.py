"""Embeddings per second through the server against a direct batched computation, in one run.

    python -m tools.bench.embeddings [--rounds 5] [--inputs 64] [--threads N] [--no-gguf]

- `bare`: in this process, on the model miserver's transformers engine loads
  (`load_transformers_engine`), each text tokenised with the engine's own
  tokenizer and then `miserver.engines.transformers.embedding.embed(model,
  ids, "mean", pad)` called directly: the same length-sorted, right-padded
  batched forward of `model.base_model` the server runs, with no HTTP, JSON,
  slot or checks around it;
- `server`: `POST /v1/embeddings` with the same texts (one request, float
  format) to `miserver serve --model SmolLM2-135M-Instruct`, a subprocess on
  loopback, timed until the whole JSON body is in;
- `bare-gguf` / `server-gguf` (unless `--no-gguf`): a plain
  `llama_cpp.Llama(embedding=True, pooling_type=MEAN)` embedding the texts
  one `embed(text)` call at a time (the server also runs one input per
  decode), and the same request naming `SmolLM2-135M-Instruct:Q4_1` to a
  second `miserver serve` that starts on the GGUF.

The texts are `--inputs` sentences of 20-60 words (fixed seed). Every path's
vectors are checked against its base (`bare`, or `bare-gguf`) within 1e-5 of
the vector's largest component. Rounds are interleaved; the table gives the
median inputs/s and the ratio of each server path to its base (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import torch

from miserver.engines.transformers import load_transformers_engine
from miserver.engines.transformers.embedding import embed
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.embeddings")

MODEL_ID = "SmolLM2-135M-Instruct"
GGUF_ID = f"{MODEL_ID}:Q4_1"
VOCABULARY = " ".join(
    (
        "the a river model server vector token layer mean input batch quick brown fox jumps",
        "over lazy dog committee budget review claim weather city music garden window paper",
        "light history science market language number answer question simple careful every",
    )
).split(" ")
BASES = {"bare": "bare", "server": "bare", "bare-gguf": "bare-gguf", "server-gguf": "bare-gguf"}


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(20, 60))).capitalize() + "."
        for _ in range(count)
    ]


def close(found: np.ndarray, expected: np.ndarray) -> bool:
    scale = max(1.0, float(np.abs(expected).max()))
    return bool(np.abs(found - expected).max() <= 1e-5 * scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-gguf", action="store_true", help="skip the llama.cpp paths")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = from_env()
    engine = load_transformers_engine(
        embedded_default(), model_id=MODEL_ID, cache_dir=settings.cache_dir
    )
    inputs = texts(args.inputs)
    tokenizer = engine.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = sum(len(engine.tokenize(t)) for t in inputs)
    serve_args = ["--threads", str(args.threads)] if args.threads else []

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-embed-")))
        client = stack.enter_context(httpx.Client(timeout=600.0))

        def bare() -> np.ndarray:
            ids = [engine.tokenize(t) for t in inputs]
            return embed(engine.model, ids, "mean", int(pad))

        def server(base_url: str, model: str) -> Callable[[], np.ndarray]:
            def run() -> np.ndarray:
                body = {"model": model, "input": inputs, "encoding_format": "float"}
                response = client.post(f"{base_url}/embeddings", json=body)
                response.raise_for_status()
                return np.array([d["embedding"] for d in response.json()["data"]], np.float32)

            return run

        base_url = stack.enter_context(
            common.served(
                tmp / "data", settings.cache_dir, args.threads, ["--model", MODEL_ID, *serve_args]
            )
        )
        paths: dict[str, Callable[[], np.ndarray]] = {
            "bare": bare,
            "server": server(base_url, MODEL_ID),
        }
        if not args.no_gguf:
            llama = llama_cpp.Llama(
                model_path=str(embedded_default()),
                embedding=True,
                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                n_threads=args.threads or None,
                n_threads_batch=args.threads or None,
                verbose=False,
            )
            stack.callback(llama.close)
            gguf_url = stack.enter_context(
                common.served(
                    tmp / "data-gguf",
                    settings.cache_dir,
                    args.threads,
                    ["--model", GGUF_ID, *serve_args],
                )
            )
            paths["bare-gguf"] = lambda: np.array([llama.embed(t) for t in inputs], np.float32)
            paths["server-gguf"] = server(gguf_url, GGUF_ID)
        times, same = measure(paths, args.rounds)
    engine.close()
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads in this process, "
        f"{args.rounds} rounds, {args.inputs} inputs ({tokens} tokens on SmolLM2)\n\n"
        + table(times, same, args.inputs)
    )
    return 0


def measure(
    paths: dict[str, Callable[[], np.ndarray]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """A warm-up of every path (its vectors checked against its base), then rotating rounds."""
    vectors = {name: fn() for name, fn in paths.items()}
    same = {name: close(vectors[name], vectors[BASES[name]]) for name in paths}
    times: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - started)
            log.info("round %d %-11s %7.3f s", i + 1, name, times[name][-1])
    return times, same


def table(times: dict[str, list[float]], same: dict[str, bool], inputs: int) -> str:
    def rates(name: str) -> Sequence[float]:
        return [inputs / s for s in times[name]]

    lines = [
        "| path | median inputs/s | min | max | median wall (s) | same vectors as base "
        "| ratio to base |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name in times:
        found, base = rates(name), rates(BASES[name])
        ratio = statistics.median(found) / statistics.median(base)
        lines.append(
            f"| {name} | {statistics.median(found):.1f} | {min(found):.1f} | {max(found):.1f} "
            f"| {statistics.median(times[name]):.3f} | {'yes' if same[name] else 'no'} "
            f"| {ratio:.3f} ({BASES[name]}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
