"""Is the plan right on this machine? Its predicted decode cost, and its settings against a grid.

    python -m tools.bench.plan [--tokens 128] [--rounds 3] [--engines llama.cpp,transformers]

For each engine, on the embedded SmolLM2 GGUF (converted for transformers):

- `planned`: `miserver serve --engine E --auto-plan`: the start's load is planned
  (GET /api/plan answers that plan, `from_last_load`), so the server runs the
  plan's settings; its `predicted.s_per_token` is read from the plan.
- the grid: `miserver serve --engine E --threads T --batch-size B` for T in 1, 2
  and B in 256, 512 (serial, the other settings the defaults).

The five servers of an engine start one after the other, each once its
start-up load is done (so the planned server's probes have the machine to
themselves), then run at once and take turns: each answers one
warm-up, then `--rounds` greedy chats of up to `--tokens` tokens, round by
round, naming its resident model, while the bench listens to GET
/api/events; a turn's decode
seconds a token are 1 / the `done` event's `tok_s` (decode only, the prompt
excluded), the median over the rounds. Markdown to stdout. Issue 21's goals:
predicted within ±30 % of the planned server's measured s/token, and the
planned settings' decode tokens/s >= 0.95 × the best of the grid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.plan")

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
GRID = [(threads, batch) for threads in (1, 2) for batch in (256, 512)]


class DoneEvents:
    """The `done` events of GET /api/events, read in a thread while the block runs."""

    def __init__(self, api: str) -> None:
        self._api = api
        self.rates: list[float] = []
        self._client = httpx.Client(timeout=None)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> DoneEvents:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *_: object) -> None:
        self._client.close()

    def _read(self) -> None:
        name = ""
        with (
            contextlib.suppress(httpx.HTTPError, RuntimeError),
            self._client.stream("GET", f"{self._api}/events") as events,
        ):
            for line in events.iter_lines():
                self._ready.set()
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name == "done":
                    data = json.loads(line.removeprefix("data: "))
                    if not data["cancelled"] and data["tok_s"] > 0:
                        self.rates.append(float(data["tok_s"]))


def decode_s(base_url: str, model: str, tokens: int, rounds: int, warm: bool = True) -> list[float]:
    """Decode seconds a token of each of `rounds` turns (after one warm-up when `warm`)."""
    api = base_url.removesuffix("/v1") + "/api"
    with DoneEvents(api) as done, httpx.Client(timeout=600.0) as client:
        for _ in range(rounds + int(warm)):
            count = len(done.rates)
            common.server_json(client, base_url, tokens, model=model, messages=PROMPT)
            deadline = time.monotonic() + 5.0  # the `done` event follows the reply
            while len(done.rates) == count and time.monotonic() < deadline:
                time.sleep(0.05)
    return [1.0 / rate for rate in done.rates[int(warm) :]]


def settled(base_url: str, timeout_s: float = 300.0) -> None:
    """Wait until the server's start-up load (and its plan) is done."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = httpx.get(base_url.removesuffix("/v1") + "/api/info", timeout=10).json()
        if info["state"] == "ready" and info.get("model"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{base_url} did not finish its start-up load")


def model_of(base_url: str) -> str:
    """The resident model's id (a request naming another would load that one instead)."""
    return str(httpx.get(base_url.removesuffix("/v1") + "/api/info").json()["model"]["id"])


def measure(engine: str, tokens: int, rounds: int, work: Path) -> dict[str, Any]:
    """Every server of `engine` up at once, their rounds interleaved (a busy spell of the
    machine falls on all of them alike)."""
    configs = {"planned": ["--engine", engine, "--auto-plan"]}
    for threads, batch in GRID:
        name = f"threads {threads}, batch {batch}"
        configs[name] = ["--engine", engine, "--threads", str(threads), "--batch-size", str(batch)]
    found: dict[str, Any] = {"engine": engine}
    cache = from_env().cache_dir
    with contextlib.ExitStack() as stack:
        urls = {}
        for i, (name, args) in enumerate(configs.items()):
            urls[name] = stack.enter_context(
                common.served(work / f"{engine}-{i}", cache, None, args)
            )
            settled(urls[name])  # the planned start's probes run alone on the machine
        plan = httpx.get(urls["planned"].removesuffix("/v1") + "/api/plan", timeout=60).json()
        assert plan.get("from_last_load"), plan
        found["values"] = plan["values"]
        found["predicted"] = plan["predicted"]["s_per_token"]
        models = {name: model_of(url) for name, url in urls.items()}
        runs: dict[str, list[float]] = {name: [] for name in urls}
        for name, url in urls.items():  # one warm-up each
            decode_s(url, models[name], tokens, 0)
        for _ in range(rounds):
            for name, url in urls.items():
                runs[name] += decode_s(url, models[name], tokens, 1, warm=False)
    found["planned"] = statistics.median(runs.pop("planned"))
    found["grid"] = {name: statistics.median(seconds) for name, seconds in runs.items()}
    found["model"] = models["planned"]
    log.info("%s: %s", engine, found)
    return found


def report(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| engine | settings | decode ms/token | tokens/s | vs best of grid |",
        "|---|---|---:|---:|---:|",
    ]
    summary = []
    for found in results:
        best = min(found["grid"].values())
        rows = [("planned: " + _values(found["values"]), found["planned"])]
        rows += list(found["grid"].items())
        for label, seconds in rows:
            lines.append(
                f"| {found['engine']} | {label} | {seconds * 1000:.2f} | {1 / seconds:.1f} "
                f"| {best / seconds:.3f} |"
            )
        error = found["predicted"] / found["planned"] - 1
        summary.append(
            f"{found['engine']}: predicted {found['predicted'] * 1000:.2f} ms/token, measured "
            f"{found['planned'] * 1000:.2f} ({error:+.0%}); planned / best of grid "
            f"{best / found['planned']:.3f} (tokens/s)"
        )
    return "\n".join(lines) + "\n\n" + "\n".join(summary) + "\n"


def _values(values: dict[str, Any]) -> str:
    keys = ("threads", "batch-size", "parallel", "ctx-size", "dtype")
    return ", ".join(f"{k} {values[k]}" for k in keys if k in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="llama.cpp,transformers")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        results = [
            measure(engine, args.tokens, args.rounds, Path(tmp))
            for engine in args.engines.split(",")
        ]
    sys.stdout.write(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
