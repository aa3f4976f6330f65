"""A two-layer circuit steering against the same generation unsteered, on the engine and
through the server.

    python -m tools.bench.circuits [--rounds 5] [--tokens 128] [--threads N]

Greedy generation of `--tokens` tokens on SmolLM2 (transformers) with the SAE
the tests train attached at layers 6 and 12, and a 3-member circuit over both
(one member at layer 6, two at layer 12). Paths:

- `engine` / `engine-circuit`: the engine's own decode loop in this process,
  without and with the circuit's two per-layer vectors hooked;
- `server` / `server-circuit`: `POST /v1/chat/completions` to `miserver serve`
  (a subprocess on loopback) with the circuit inactive, then active (the
  response checked to carry its `circuit` member and X-miLLM-Circuit-Rung).

Activating and deactivating happen between calls, outside the time. Every call
gets a fresh prompt, so no path reuses a KV prefix. Rounds are interleaved. The
markdown table goes to stdout with each steered path's ratio to its unsteered
twin (issue 19's goal: `server-circuit` >= 0.95).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from miserver.engines.transformers import load_transformers_engine
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.source import FixedSource
from tools import sae_train
from tools.bench import common
from tools.bench.common import Run
from tools.bench.steering import (
    MODEL_ID,
    SAE_ID,
    attached_server,
    on_engine,
    prompt,
    server_bench_main,
    table,
    trained_sae,
)

JSON = {"Content-Type": "application/json"}
MEMBERS = [(6, 7, 8.0), (12, 42, -4.0), (12, 100, 2.5)]  # (layer, index, strength)
CIRCUIT = {
    "schema": "mi.circuit/v1",
    "id": "bench-circuit",
    "members": [{"sae_id": SAE_ID, "layer": la, "index": i, "strength": s} for la, i, s in MEMBERS],
    "evidence": {"rung": 2},
}
BASES = {"engine-circuit": "engine", "server-circuit": "server"}


def on_server(
    client: httpx.Client, base_url: str, api: str, round_: int, tokens: int, *, active: bool
) -> Run:
    """One chat with the circuit active or not (set before the clock starts)."""
    verb = client.put if active else client.delete
    verb(f"{api}/circuits/bench-circuit/active", headers=JSON).raise_for_status()
    body = common.chat_body(MODEL_ID, prompt(round_), tokens, stream=False)
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    steered = "X-miLLM-Circuit-Rung" in response.headers
    if steered != active or active != response.headers["X-miLLM-Steering"].startswith("circuit;"):
        raise RuntimeError("the circuit did not steer as set")
    return Run(response.json()["usage"]["completion_tokens"], seconds, "")


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    sae, folder = trained_sae()
    engine = load_transformers_engine(
        sae_train.smollm2_gguf(), model_id="bench", cache_dir=sae_train.cache_dir()
    )
    items = [
        applied_sae("circuit", sae, layer, {i: s for la, i, s in MEMBERS if la == layer})
        for layer in sorted({la for la, _, _ in MEMBERS})
    ]
    fixed = FixedSource(snapshot(items))
    counter = itertools.count()
    with attached_server(folder, threads, work) as (client, base_url, api):
        client.post(f"{api}/steering/attachments", json={"sae_id": SAE_ID, "layer": 6})
        client.post(f"{api}/circuits", json=CIRCUIT).raise_for_status()

        def steered_engine() -> Run:
            with engine.steered(fixed):
                return on_engine(engine, next(counter), tokens)

        def path(active: bool) -> Callable[[], Run]:
            return lambda: on_server(client, base_url, api, next(counter), tokens, active=active)

        paths: dict[str, Callable[[], Run]] = {
            "engine": lambda: on_engine(engine, next(counter), tokens),
            "engine-circuit": steered_engine,
            "server": path(False),
            "server-circuit": path(True),
        }
        runs = common.interleave(paths, rounds)
    engine.close()
    return runs


def main(argv: list[str] | None = None) -> int:
    return server_bench_main(
        argv, __doc__ or "", "bench-circuits-", measure, lambda runs: table(runs, BASES)
    )


if __name__ == "__main__":
    sys.exit(main())
