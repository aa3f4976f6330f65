"""Steered against unsteered decode speed on the transformers engine, in one run.

    python -m tools.bench.steering [--rounds 5] [--tokens 128] [--threads N]

Greedy generation of `--tokens` tokens from one chat prompt on SmolLM2 with
the engine's own decode loop, interleaving rounds without steering and with
the trained SAE's feature steering (a hook adding Σ strength·W_dec[i] to the
layer's output at every position). The steering state never reuses the other's
KV prefix, and the prompt is changed every round so neither path reuses its own.
Prints a markdown table (median tokens/s and the steered / unsteered ratio;
goal >= 0.95). Uses the SAE the tests train and cache (`tools/sae_train.py`).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch

from miserver.engines.base import ChatPrompt, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.steering.applied import item, snapshot
from miserver.steering.sae import SAE, load_sae
from miserver.steering.source import FixedSource
from tools import sae_train

log = logging.getLogger("bench.steering")


def trained_sae() -> SAE:
    """The default-config SAE from the cache, trained now if it is missing."""
    config = sae_train.TrainConfig()
    folder = sae_train.cache_dir() / "saes" / config.name()
    if not (folder / "sae_weights.safetensors").is_file():
        sae_train.build(folder, config)
    return load_sae(folder)


def tokens_per_second(engine: TransformersEngine, round_: int, tokens: int) -> float:
    prompt = ChatPrompt(({"role": "user", "content": f"Essay {round_}: the history of Rome."},))
    ids = engine.render_chat(prompt)
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    started = time.perf_counter()
    count = sum(isinstance(t, Token) for t in engine.generate(ids, params, None))
    return count / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_transformers_engine(
        sae_train.smollm2_gguf(), model_id="bench", cache_dir=sae_train.cache_dir()
    )
    sae = trained_sae()
    steering = FixedSource(snapshot([item("inline", sae, sae.layer, {7: 8.0, 42: -4.0, 100: 2.5})]))
    rates: dict[str, list[float]] = {"unsteered": [], "steered": []}
    tokens_per_second(engine, 0, 8)  # warm-up
    for round_ in range(1, args.rounds + 1):
        rates["unsteered"].append(tokens_per_second(engine, 2 * round_, args.tokens))
        with engine.steered(steering):
            rates["steered"].append(tokens_per_second(engine, 2 * round_ + 1, args.tokens))
        log.info(
            "round %d: %.1f / %.1f tok/s", round_, rates["unsteered"][-1], rates["steered"][-1]
        )
    median = {name: statistics.median(values) for name, values in rates.items()}
    lines = ["| path | median tok/s | min | max |", "|---|---:|---:|---:|"]
    lines += [
        f"| {name} | {median[name]:.1f} | {min(v):.1f} | {max(v):.1f} |"
        for name, v in rates.items()
    ]
    ratio = median["steered"] / median["unsteered"]
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds of "
        f"{args.tokens} greedy tokens\n\n"
        + "\n".join(lines)
        + f"\n\nratio steered / unsteered (medians): {ratio:.3f}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
