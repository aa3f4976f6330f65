"""Generation with two armed probes against the same generation with none, through the server.

    python -m tools.bench.probes [--rounds 5] [--tokens 128] [--threads N]

Greedy chats of `--tokens` tokens to `miserver serve` on SmolLM2 (transformers)
with the SAE the tests train attached at its hook layer, and two probes defined:
the French-vs-English linear probe tools/probe_train.py trains (windows
`last_user` and `completion`) and an SAE-feature detector over 16 features of
the attached SAE (window `prompt` and `completion`, max). Paths:

- `server`: both probes disarmed;
- `server-probes`: both armed (each position of every pass feeds both; results
  shaped, sent and recorded in SQLite), JSON;
- `server-probes-stream`, `server-stream`: the same, streamed.

Arming and disarming happen between calls, outside the time. Every call gets
a fresh prompt, so no path reuses a KV prefix (a monitored one reuses none
anyway). Rounds are interleaved. The markdown table goes to stdout with each
path's ratio to its unmonitored twin (issue 18's goal: `server-probes` >= 0.95).
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tools import probe_train, sae_train
from tools.bench import common
from tools.bench.common import Run
from tools.bench.steering import (
    MODEL_ID,
    SAE_ID,
    attached_server,
    prompt,
    server_bench_main,
    table,
    trained_sae,
)

log = logging.getLogger("bench.probes")

NAMES = ("french", "sae-mix")
JSON = {"Content-Type": "application/json"}
BASES = {
    "server": "server",
    "server-probes": "server",
    "server-stream": "server-stream",
    "server-probes-stream": "server-stream",
}


def trained_probe() -> Path:
    """The French probe's sidecar from the cache (trained now if it is missing)."""
    config = probe_train.TrainConfig()
    folder = sae_train.cache_dir() / "probes" / config.name()
    if not (folder / "metrics.json").is_file():
        probe_train.build(folder, config)
    return folder / f"{probe_train.NAME}.json"


def on_server(
    client: httpx.Client,
    base_url: str,
    api: str,
    round_: int,
    tokens: int,
    *,
    armed: bool,
    stream: bool,
) -> Run:
    for name in NAMES:  # outside the time
        action = "arm" if armed else "disarm"
        client.post(f"{api}/probes/{name}/{action}", headers=JSON).raise_for_status()
    body = common.chat_body(MODEL_ID, prompt(round_), tokens, stream=stream)
    started = time.perf_counter()
    if stream:
        count, carried = 0, False
        with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                carried |= "millm_probe_verdicts" in chunk
                if chunk.get("usage"):
                    count = chunk["usage"]["completion_tokens"]
        seconds = time.perf_counter() - started
    else:
        response = client.post(f"{base_url}/chat/completions", json=body)
        seconds = time.perf_counter() - started
        response.raise_for_status()
        out = response.json()
        count, carried = out["usage"]["completion_tokens"], "millm_probe_verdicts" in out
    if carried != armed:
        raise RuntimeError("probe verdicts missing, or sent with nothing armed")
    return Run(count, seconds, "")


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    sae, folder = trained_sae()
    sidecar = trained_probe()
    counter = itertools.count()
    with attached_server(folder, threads, work) as (client, base_url, api):
        client.post(f"{api}/probes/import", json={"path": str(sidecar)}).raise_for_status()
        mix = {
            "detector": {
                "kind": "sae_features",
                "sae_id": SAE_ID,
                "layer": sae.layer,
                "features": [{"index": i * 97 % sae.d_sae, "weight": 1.0} for i in range(16)],
            },
            "aggregate": "max",
            "threshold": 1.0,
            "windows": ["prompt", "completion"],
        }
        client.put(f"{api}/probes/sae-mix", json=mix).raise_for_status()
        on_server(client, base_url, api, -1, 4, armed=True, stream=False)  # warm-up, proof

        def path(armed: bool, stream: bool) -> Callable[[], Run]:
            return lambda: on_server(
                client, base_url, api, next(counter), tokens, armed=armed, stream=stream
            )

        paths = {
            "server": path(False, False),
            "server-probes": path(True, False),
            "server-stream": path(False, True),
            "server-probes-stream": path(True, True),
        }
        return common.interleave(paths, rounds)


def main(argv: list[str] | None = None) -> int:
    return server_bench_main(
        argv,
        __doc__ or "",
        "bench-probes-",
        measure,
        lambda runs: table(runs, BASES, "unmonitored"),
    )


if __name__ == "__main__":
    sys.exit(main())
