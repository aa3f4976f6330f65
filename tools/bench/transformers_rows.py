"""Continuous batching on transformers: k rows decoded together, bare and through `miserver
serve`, unsteered and each row steered its own way.

    python -m tools.bench.transformers_rows [--rounds 3] [--tokens 128] [--threads N]
        [--parallel 8]

SmolLM2-135M-Instruct on transformers (the embedded GGUF's cached HF
conversion), the eight chat prompts of `tools.bench.rows` (as `tools.bench.concurrency`):

- `bare k=1` / `bare k=8`: the model's own forward loop in this process, no
  miserver code and no `generate`: k prompts left-padded into one batch
  (attention mask, position ids from it), prefilled in one pass, then
  `--tokens` greedy steps of one forward pass for all k rows on a
  `DynamicCache`. EOS is ignored. Aggregate tok/s = k x tokens over the
  steps' seconds; `with prefill` counts the prefill.
- `server C=1,2,4,8`: `miserver serve --model SmolLM2-135M-Instruct
  --parallel 8` (a subprocess on loopback) with the SAE the tests train
  (`tools/sae_train.py`) attached. C clients at once, each one greedy chat
  completion (`max_tokens` = `--tokens`) of its own prompt.
- `server C=8 steered`: the same eight requests, each with its own inline
  steering (three features, a different set per client), so no two rows of
  the batch add the same vector; every response's `X-miLLM-Steering` must
  name an inline set.

- TTFT: as `tools.bench.concurrency` measures it (`tools.bench.rows`: a streamed
  request on the idle server, and while 7 others stream), unsteered.

Rounds are interleaved (`common.interleave`) after a warm-up, then the TTFT
rounds. Goals: server C=8 / C=1 >= 0.85 x bare k=8 / k=1; C=8 steered >=
0.9 x C=8; TTFT busy / idle <= 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import torch
from transformers import DynamicCache, PreTrainedModel

from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import load_transformers_engine
from tools import sae_train
from tools.bench import common
from tools.bench.bare_batch import Batched
from tools.bench.rows import (
    client_counts,
    goal_row,
    health,
    messages,
    rows_table,
    ttft_rounds,
    ttft_table,
)
from tools.bench.steering import trained_sae

log = logging.getLogger("bench.transformers_rows")

MODEL_ID = "SmolLM2-135M-Instruct"
SAE_ID = "bench-sae"
Run = common.Run


def features(i: int) -> list[dict[str, Any]]:
    """Client i's own inline set: three features, none shared with another client's."""
    return [
        {"index": 7 + i, "strength": 8.0},
        {"index": 42 + i, "strength": -4.0},
        {"index": 100 + i, "strength": 2.5},
    ]


# -- bare ------------------------------------------------------------------------------


def bare_rows(model: PreTrainedModel, prompts: Sequence[Sequence[int]], tokens: int) -> Batched:
    """Prefill the prompts left-padded in one pass, then `tokens` greedy steps of all rows."""
    k, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((k, width), dtype=torch.long)
    mask = torch.zeros((k, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    cache = DynamicCache(config=model.config)
    started = time.perf_counter()
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        last = out.logits[:, -1].argmax(-1)
        prefilled = time.perf_counter()
        position = mask.sum(-1)
        for _ in range(tokens):
            mask = torch.cat([mask, torch.ones((k, 1), dtype=torch.long)], dim=1)
            out = model(
                input_ids=last[:, None],
                attention_mask=mask,
                position_ids=position[:, None],
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            last = out.logits[:, -1].argmax(-1)
            position = position + 1
    seconds = time.perf_counter() - prefilled
    rows = tuple(Run(tokens, seconds, "") for _ in prompts)
    return Batched(tokens * k, seconds, "", prefill=prefilled - started, rows=rows)


# -- the server ------------------------------------------------------------------------


def _chat(client: httpx.Client, base_url: str, i: int, tokens: int, *, steered: bool) -> common.Run:
    body = common.chat_body(MODEL_ID, messages(i), tokens, stream=False)
    if steered:
        body["steering"] = {"sae_id": SAE_ID, "features": features(i)}
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    header = response.headers["X-miLLM-Steering"]
    if steered != header.startswith("inline"):
        raise RuntimeError(f"client {i} asked steered={steered}, the header says {header}")
    return Run(response.json()["usage"]["completion_tokens"], seconds, "")


def clients(
    pool: ThreadPoolExecutor,
    client: httpx.Client,
    base_url: str,
    tokens: int,
    count: int,
    *,
    steered: bool = False,
) -> Batched:
    """`count` chats at once, one prompt (and steering) each; the aggregate over the wall."""
    started = time.perf_counter()
    ask = partial(_chat, client, base_url, tokens=tokens, steered=steered)
    futures = [pool.submit(ask, i) for i in range(count)]
    rows = tuple(f.result() for f in futures)
    seconds = time.perf_counter() - started
    return Batched(sum(r.tokens for r in rows), seconds, "", rows=rows)


def measure(
    args: argparse.Namespace, work: Path
) -> tuple[dict[str, list[Batched]], dict[str, list[float]]]:
    _, folder = trained_sae()
    saes = work / "saes"
    saes.mkdir()
    (saes / SAE_ID).symlink_to(folder, target_is_directory=True)
    engine = load_transformers_engine(
        sae_train.smollm2_gguf(), model_id="bench", cache_dir=sae_train.cache_dir()
    )
    prompts = [engine.render_chat(ChatPrompt(messages(i))) for i in range(8)]
    serve = ["--model", MODEL_ID, "--saes-dir", str(saes), "--parallel", str(args.parallel)]
    serve += [] if args.threads is None else ["--threads", str(args.threads)]
    with (
        common.served(work / "data", sae_train.cache_dir(), args.threads, serve) as base_url,
        httpx.Client(timeout=600.0) as client,
        ThreadPoolExecutor(max_workers=args.parallel) as pool,
    ):
        api = base_url.removesuffix("/v1") + "/api"
        client.post(f"{api}/steering/attachments", json={"sae_id": SAE_ID}).raise_for_status()
        paths = {
            f"bare k={k}": partial(bare_rows, engine.model, prompts[:k], args.tokens)
            for k in (1, args.parallel)
        }
        for count in client_counts(args.parallel):
            paths[f"server C={count}"] = partial(
                clients, pool, client, base_url, args.tokens, count
            )
        paths[f"server C={args.parallel} steered"] = partial(
            clients, pool, client, base_url, args.tokens, args.parallel, steered=True
        )
        backend = health(client, base_url)["backend"]
        if backend != "continuous_batching":
            raise RuntimeError(f"the server serves {backend}")
        runs = cast(dict[str, list[Batched]], common.interleave(paths, args.rounds))
        ttft = ttft_rounds(
            pool, client, base_url, args.parallel, args.tokens, args.rounds, MODEL_ID
        )
    engine.close()
    return runs, ttft


def goals(runs: dict[str, list[Batched]], ttft: dict[str, list[float]], parallel: int) -> str:
    med = {name: common.median_rate(found) for name, found in runs.items()}
    waits = {name: statistics.median(found) for name, found in ttft.items()}
    server = med[f"server C={parallel}"] / med["server C=1"]
    bare = med[f"bare k={parallel}"] / med["bare k=1"]
    steered = med[f"server C={parallel} steered"] / med[f"server C={parallel}"]
    lines = [
        "| goal | value | target |",
        "|---|---:|---:|",
        f"| server C={parallel} / C=1 | {server:.3f} | |",
        f"| bare k={parallel} / k=1 | {bare:.3f} | |",
        goal_row("(server ratio) / (bare ratio)", server / bare, 0.85),
        goal_row(f"C={parallel} steered / C={parallel} unsteered", steered, 0.9),
        goal_row("TTFT busy / idle (medians)", waits["busy"] / waits["idle"], 3.0, at_most=True),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for both")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-rows-") as tmp:
        runs, ttft = measure(args, Path(tmp))
    bare = {name: found for name, found in runs.items() if name.startswith("bare")}
    server = {name: found for name, found in runs.items() if name.startswith("server")}
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"server: --parallel {args.parallel}; {args.rounds} rounds of {args.tokens} greedy "
        "tokens\n\n"
        + rows_table(bare, args.tokens, "bare k=1")
        + "\n"
        + rows_table(server, args.tokens, "server C=1")
        + "\n"
        + ttft_table(ttft, args.parallel)
        + "\n"
        + goals(runs, ttft, args.parallel)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
