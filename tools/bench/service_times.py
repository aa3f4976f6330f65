"""The engine's service times the cluster simulation runs on (issue 49 item 6).

    python -m tools.bench.service_times [--rounds 9] [--threads N] [--json FILE]

On the default model (SmolLM2's Q4_1 GGUF) with llama.cpp's batch API driven
directly (`bare_batch.bare_engine`, 4 sequences, as the planner's default
rows here), in interleaved rounds:

- `decode_ms[k]`: one step of k rows (one `llama_decode` of k tokens, each
  row 256 tokens into its sequence), k = 1..4;
- `prefill_ms_per_token`: a 256-token prompt prefilled in one decode, per token;
- `cvec_ms`: setting the context's control vector (a steering) to another
  one, which a step does once per distinct steering set of its rows, each
  set its own decode (docs/DECISIONS.md, contract 0.25.0).

Medians over the rounds go to stdout as a table and, with `--json`, to a file
that `tools/bench/cluster_sim.py --times FILE` reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import llama_cpp
import numpy as np
import torch

from miserver.engines.llamacpp.steering import ControlVector
from tools.bench.bare_batch import Bare, _decode, bare_engine, put
from tools.sae_train import smollm2_gguf

ROWS = 4
PROMPT = 256
WINDOW = ROWS * 1024


def _prompt(seed: int, length: int = PROMPT) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(1000, 40000, size=length)]


def _prefill(bare: Bare, seq: int, ids: list[int]) -> float:
    started = time.perf_counter()
    for j, token in enumerate(ids):
        put(bare.batch, j, token, j, seq, j == len(ids) - 1)
    _decode(bare, len(ids))
    return time.perf_counter() - started


def _step(bare: Bare, rows: int, at: list[int]) -> float:
    """One step of sequences 0..rows-1, each at its next position (`at`, moved on)."""
    for seq in range(rows):
        put(bare.batch, seq, 1000 + seq, at[seq], seq, True)
        at[seq] += 1
    started = time.perf_counter()
    _decode(bare, rows)
    return time.perf_counter() - started


def _cvec(control: ControlVector, layers: int, width: int, seed: int) -> float:
    vector = torch.from_numpy(np.random.default_rng(seed).normal(size=width).astype(np.float32))
    started = time.perf_counter()
    control.set({layers // 2: vector})
    return time.perf_counter() - started


def _round(bare: Bare, control: ControlVector, round_: int) -> dict[str, float]:
    """One round's samples, its paths in an order rotated by `round_`."""
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(bare.context.ctx), True)
    n_embd, n_layer = int(bare.llama.n_embd()), int(llama_cpp.llama_model_n_layer(bare.llama.model))
    paths: dict[str, Callable[[], float]] = {
        # a sequence of its own, beside the decoding rows
        "prefill": partial(_prefill, bare, ROWS, _prompt(round_)),
        "cvec": partial(_cvec, control, n_layer, n_embd, round_),
    }
    for seq in range(ROWS):
        _prefill(bare, seq, _prompt(1000 * round_ + seq))
    at = [PROMPT] * ROWS
    for k in range(1, ROWS + 1):
        paths[f"decode{k}"] = partial(_steps, bare, k, at)
    names = list(paths)
    found = {
        name: paths[name]() for name in names[round_ % len(names) :] + names[: round_ % len(names)]
    }
    found["prefill"] /= PROMPT
    control.set({})
    return found


def _steps(bare: Bare, rows: int, at: list[int]) -> float:
    """The median of 8 steps of `rows` rows."""
    return statistics.median(_step(bare, rows, at) for _ in range(8))


def measure(rounds: int, threads: int | None) -> dict[str, object]:
    samples: dict[str, list[float]] = {}
    with bare_engine(smollm2_gguf(), WINDOW, threads, ROWS + 1) as bare:
        control = ControlVector(
            bare.context.ctx,
            int(bare.llama.n_embd()),
            int(llama_cpp.llama_model_n_layer(bare.llama.model)),
        )
        for round_ in range(rounds):
            for name, seconds in _round(bare, control, round_).items():
                samples.setdefault(name, []).append(seconds)
    med = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    return {
        "rows": ROWS,
        "prefill_ms_per_token": med["prefill"],
        "decode_ms": {str(k): med[f"decode{k}"] for k in range(1, ROWS + 1)},
        "cvec_ms": med["cvec"],
        "rounds": rounds,
    }


def report(times: dict[str, object]) -> str:
    decode = times["decode_ms"]
    assert isinstance(decode, dict)
    lines = [
        "| service time | ms |",
        "|---|---:|",
        f"| prefill, per prompt token (256 at once) | {times['prefill_ms_per_token']:.3f} |",
        *(
            f"| decode step, {k} row{'s' if k != '1' else ''} | {v:.2f} |"
            for k, v in decode.items()
        ),
        f"| control vector set (a steering switch) | {times['cvec_ms']:.3f} |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    times = measure(args.rounds, args.threads)
    if args.json is not None:
        args.json.write_text(json.dumps(times, indent=2) + "\n")
    sys.stdout.write(report(times) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
