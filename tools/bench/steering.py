"""Steered against unsteered decode speed, through the server and on the engine, in one run.

    python -m tools.bench.steering [--rounds 5] [--tokens 128] [--threads N]

Greedy generation of `--tokens` tokens on SmolLM2 (transformers), with the
SAE the tests train and cache (`tools/sae_train.py`):

- `engine` / `engine-steered`: the engine's own decode loop in this
  process, without and with a three-feature steering hook;
- `server` / `server-inline` / `server-profile`: `POST /v1/chat/completions`
  to `miserver serve` (a subprocess on loopback) with the SAE attached
  through /api: no steering field, the same three features as inline
  `steering`, and a saved profile holding them.

Every call gets a fresh prompt (a round number in it), so no path reuses a
KV prefix another filled. Rounds are interleaved (the order rotates). The
markdown table goes to stdout with the ratio of each steered path to its
unsteered counterpart (goal >= 0.95).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

from miserver.engines.base import ChatPrompt, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.sae import SAE, load_sae
from miserver.steering.source import FixedSource
from tools import sae_train
from tools.bench import common
from tools.bench.common import Run

log = logging.getLogger("bench.steering")

MODEL_ID = "SmolLM2-135M-Instruct"
SAE_ID = "bench-sae"
FEATURES = {7: 8.0, 42: -4.0, 100: 2.5}
BASES = {
    "engine-steered": "engine",
    "server-inline": "server",
    "server-profile": "server",
}


def trained_sae() -> tuple[SAE, Path]:
    """The default-config SAE from the cache (trained now if it is missing), and its folder."""
    config = sae_train.TrainConfig()
    folder = sae_train.cache_dir() / "saes" / config.name()
    if not (folder / "sae_weights.safetensors").is_file():
        sae_train.build(folder, config)
    return load_sae(folder), folder


def prompt(round_: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Essay {round_}: the history of Rome."}]


def on_engine(engine: TransformersEngine, round_: int, tokens: int) -> Run:
    ids = engine.render_chat(ChatPrompt(tuple(prompt(round_))))
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    started = time.perf_counter()
    count = sum(isinstance(t, Token) for t in engine.generate(ids, params, None))
    return Run(count, time.perf_counter() - started, "")


def on_server(client: httpx.Client, base_url: str, round_: int, tokens: int, **extra: Any) -> Run:
    body = {**common.chat_body(MODEL_ID, prompt(round_), tokens, stream=False), **extra}
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    if extra and response.headers["X-miLLM-Steering"] == "none":
        raise RuntimeError("a steered path ran unsteered")
    return Run(response.json()["usage"]["completion_tokens"], seconds, "")


@contextlib.contextmanager
def attached_server(
    folder: Path, threads: int | None, work: Path
) -> Iterator[tuple[httpx.Client, str, str]]:
    """`miserver serve` on SmolLM2 (transformers) with the SAE in `folder` attached as SAE_ID
    at its hook layer; yields a client, the /v1 base URL and the /api one."""
    saes = work / "saes"
    saes.mkdir()
    (saes / SAE_ID).symlink_to(folder, target_is_directory=True)
    args = ["--model", MODEL_ID, "--saes-dir", str(saes)]
    with (
        common.served(work / "data", sae_train.cache_dir(), threads, args) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):
        api = base_url.removesuffix("/v1") + "/api"
        client.post(f"{api}/steering/attachments", json={"sae_id": SAE_ID}).raise_for_status()
        yield client, base_url, api


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    sae, folder = trained_sae()
    engine = load_transformers_engine(
        sae_train.smollm2_gguf(), model_id="bench", cache_dir=sae_train.cache_dir()
    )
    fixed = FixedSource(snapshot([applied_sae("inline", sae, sae.layer, FEATURES)]))
    counter = itertools.count()
    features = [{"index": i, "strength": s} for i, s in FEATURES.items()]
    with attached_server(folder, threads, work) as (client, base_url, api):
        profile = {"sae_id": SAE_ID, "layer": sae.layer, "features": features}
        client.put(f"{api}/profiles/bench", json=profile).raise_for_status()

        def steered_engine() -> Run:
            with engine.steered(fixed):
                return on_engine(engine, next(counter), tokens)

        paths: dict[str, Callable[[], Run]] = {
            "engine": lambda: on_engine(engine, next(counter), tokens),
            "engine-steered": steered_engine,
            "server": lambda: on_server(client, base_url, next(counter), tokens),
            "server-inline": lambda: on_server(
                client, base_url, next(counter), tokens, steering={"features": features}
            ),
            "server-profile": lambda: on_server(
                client, base_url, next(counter), tokens, profile="bench"
            ),
        }
        runs = common.interleave(paths, rounds)
    engine.close()
    return runs


def table(
    runs: dict[str, list[Run]], bases: dict[str, str] = BASES, against: str = "unsteered"
) -> str:
    """Each path's rates and its median's ratio to its base path's (`bases`, else itself)."""
    lines = [
        f"| path | median tok/s | min | max | ratio to {against} |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, found in runs.items():
        rates = [r.rate for r in found]
        base = bases.get(name, name)
        ratio = statistics.median(rates) / common.median_rate(runs[base])
        lines.append(
            f"| {name} | {statistics.median(rates):.1f} | {min(rates):.1f} | {max(rates):.1f} "
            f"| {ratio:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for both")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-steering-") as tmp:
        runs = measure(args.rounds, args.tokens, args.threads, Path(tmp))
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads in this process, "
        f"{args.rounds} rounds of {args.tokens} greedy tokens\n\n" + table(runs)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


Measure = Callable[[int, int, int | None, Path], dict[str, list[Run]]]


def server_bench_main(
    argv: list[str] | None, doc: str, prefix: str, measure: Measure, render: Callable[..., str]
) -> int:
    """The command line of a bench against an attached server: --rounds, --tokens,
    --threads; `measure` in a temporary folder, `render` of its runs to stdout."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        runs = measure(args.rounds, args.tokens, args.threads, Path(tmp))
    sys.stdout.write(
        f"torch {torch.__version__}, {args.rounds} rounds of {args.tokens} greedy tokens\n\n"
        + render(runs)
    )
    return 0
