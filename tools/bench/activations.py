"""A request returning SAE activations against the same request without, through the server.

    python -m tools.bench.activations [--rounds 5] [--tokens 128] [--threads N]

Greedy chats of `--tokens` tokens to `miserver serve` on SmolLM2 (transformers)
with the SAE the tests train and cache attached at its hook layer:

- `server`: no `return_sae_activations`;
- `server-activations`: `return_sae_activations {"positions": "all", "top_k": 16}`
  (every position fed, the layer captured each pass, encoded in one matmul at
  the end), JSON;
- `server-activations-last`: the same with `positions: "last"`.

Every call gets a fresh prompt (a round number in it), so no path reuses a
KV prefix (a reading request reuses none anyway). Rounds are interleaved.
The markdown table goes to stdout with each path's ratio to `server` (issue
18's goal: `server-activations` >= 0.9).
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tools.bench import common
from tools.bench.common import Run
from tools.bench.steering import (
    MODEL_ID,
    attached_server,
    prompt,
    server_bench_main,
    table,
    trained_sae,
)

log = logging.getLogger("bench.activations")

ALL = {"positions": "all", "top_k": 16}
LAST = {"positions": "last", "top_k": 16}


def on_server(
    client: httpx.Client, base_url: str, round_: int, tokens: int, reading: dict[str, Any] | None
) -> Run:
    body = common.chat_body(MODEL_ID, prompt(round_), tokens, stream=False)
    if reading is not None:
        body["return_sae_activations"] = reading
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    out = response.json()
    if ("millm" in out) != (reading is not None):
        raise RuntimeError("activations missing, or sent unasked")
    return Run(out["usage"]["completion_tokens"], seconds, "")


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    _, folder = trained_sae()
    counter = itertools.count()
    with attached_server(folder, threads, work) as (client, base_url, _):
        on_server(client, base_url, -1, 4, ALL)  # a warm-up, and proof the server reads
        paths: dict[str, Callable[[], Run]] = {
            "server": lambda: on_server(client, base_url, next(counter), tokens, None),
            "server-activations": lambda: on_server(client, base_url, next(counter), tokens, ALL),
            "server-activations-last": lambda: on_server(
                client, base_url, next(counter), tokens, LAST
            ),
        }
        return common.interleave(paths, rounds)


def main(argv: list[str] | None = None) -> int:
    return server_bench_main(
        argv,
        __doc__ or "",
        "bench-activations-",
        measure,
        lambda runs: table(runs, {name: "server" for name in runs}, "server"),
    )


if __name__ == "__main__":
    sys.exit(main())
