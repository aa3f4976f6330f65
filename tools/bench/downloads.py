"""Download throughput against `curl` alone, and the models listing against a bare scandir.

    python -m tools.bench.downloads [--rounds 5] [--mib 256] [--files 200]

A file of `--mib` MiB of random bytes is served on loopback by a small static
site shaped like the Hugging Face `resolve` URLs (Python's threaded HTTP
server). Paths, rounds interleaved:

- `curl`: `curl --silent --output FILE URL`, the bare tool;
- `server`: `POST /api/models/download` of a catalog entry naming that file
  (`miserver serve --catalog ... --hf-endpoint ...`, a subprocess), timed until
  its `done` event arrives on `/api/events`, the entry without a SHA-256;
- `server-sha`: the same entry with its SHA-256, verified after the transfer.

Each path's file is deleted right after its timing and `os.sync()` runs before
each, so no round pays for writing back an earlier round's file.

Then the listing: `--files` small GGUF files (each the first MiB of the
embedded SmolLM2, a header that parses) in the models directory; `GET
/api/models` (median of 20, after one warm-up) against `os.scandir` plus a
`stat` of each entry in the bench process. Markdown tables to stdout
(issue 20's goals: `server` / `curl` >= 0.9; the listing <= 50 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.downloads")

REPO = "bench-org/bench-GGUF"


@contextlib.contextmanager
def static_site(root: Path) -> Iterator[str]:
    """`root` served on loopback; `<base>/<repo>/resolve/main/<name>` is `root/<repo>/...`."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            return

        def translate_path(self, path: str) -> str:
            return super().translate_path(path.replace("/resolve/main/", "/"))

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def done_event(api: str, entry: str) -> float:
    """Start `entry`'s download; the seconds until its `done` event."""
    with httpx.Client(timeout=600.0) as client, client.stream("GET", f"{api}/events") as events:
        lines = events.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # `state` on connect
        started = time.perf_counter()
        client.post(f"{api}/models/download", json={"id": entry}).raise_for_status()
        name = ""
        for line in lines:
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and name == "download":
                data = json.loads(line.removeprefix("data: "))
                if data["id"] == entry and data["state"] in ("done", "error"):
                    if data["state"] == "error":
                        raise RuntimeError(data["error"])
                    return time.perf_counter() - started
    raise RuntimeError("the event stream ended")


def measure(rounds: int, mib: int, work: Path) -> dict[str, list[common.Run]]:
    site = work / "site"
    (site / REPO).mkdir(parents=True)
    data = os.urandom(mib << 20)
    (site / REPO / "bench.gguf").write_bytes(data)
    models = work / "models"
    entries = []
    for entry_id, sha in (("plain", None), ("sha", hashlib.sha256(data).hexdigest())):
        file: dict[str, Any] = {"name": "bench.gguf", "bytes": len(data)}
        file |= {"sha256": sha} if sha else {}
        entries.append(
            {
                "id": entry_id,
                "title": entry_id,
                "quant": "",
                "repo": REPO,
                "revision": "main",
                "files": [file],
            }
        )
    catalog = work / "catalog.json"
    catalog.write_text(json.dumps({"schema": "mi.catalog/v1", "models": entries}))
    counter = itertools.count()
    with static_site(site) as base:
        url = f"{base}/{REPO}/resolve/main/bench.gguf"
        args = ["--catalog", str(catalog), "--hf-endpoint", base, "--models-dir", str(models)]
        with common.served(work / "data", from_env().cache_dir, None, args) as base_url:
            api = base_url.removesuffix("/v1") + "/api"

            def bare() -> common.Run:
                out = work / f"curl-{next(counter)}.gguf"
                os.sync()  # no write-back of an earlier round's file during this one
                started = time.perf_counter()
                subprocess.run(["curl", "--silent", "--output", str(out), url], check=True)
                seconds = time.perf_counter() - started
                out.unlink()
                return common.Run(len(data) >> 20, seconds, "")

            def through(entry: str) -> common.Run:
                (models / "bench.gguf").unlink(missing_ok=True)
                os.sync()
                seconds = done_event(api, entry)
                (models / "bench.gguf").unlink()  # as the bare path drops its file
                return common.Run(len(data) >> 20, seconds, "")

            paths = {
                "curl": bare,
                "server": lambda: through("plain"),
                "server-sha": lambda: through("sha"),
            }
            return common.interleave(paths, rounds)


def listing(files: int, work: Path) -> tuple[float, float]:
    """Median ms of GET /api/models and of a bare scandir + stat, `files` GGUF files."""
    models = work / "listing"
    models.mkdir()
    with embedded_default().open("rb") as handle:
        head = handle.read(1 << 20)
    for i in range(files):
        (models / f"model-{i:03d}.gguf").write_bytes(head)
    bare = []
    for _ in range(20):
        started = time.perf_counter()
        with os.scandir(models) as found:
            for entry in found:
                entry.stat(follow_symlinks=False)
        bare.append((time.perf_counter() - started) * 1000)
    args = ["--models-dir", str(models)]
    with (
        common.served(work / "data-listing", from_env().cache_dir, None, args) as base_url,
        httpx.Client(timeout=60.0) as client,
    ):
        url = base_url.removesuffix("/v1") + "/api/models"
        assert len(client.get(url).json()["local"]) == files  # warm-up, proof
        served = []
        for _ in range(20):
            started = time.perf_counter()
            client.get(url).raise_for_status()
            served.append((time.perf_counter() - started) * 1000)
    return statistics.median(served), statistics.median(bare)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-downloads-") as tmp:
        runs = measure(args.rounds, args.mib, Path(tmp))
        served, bare = listing(args.files, Path(tmp))
    base = common.median_rate(runs["curl"])
    lines = [
        f"{args.rounds} rounds of a {args.mib} MiB file from a loopback site\n",
        "| path | median MiB/s | min | max | ratio to curl |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, found in runs.items():
        rates = [r.rate for r in found]
        lines.append(
            f"| {name} | {statistics.median(rates):.0f} | {min(rates):.0f} | {max(rates):.0f} "
            f"| {statistics.median(rates) / base:.3f} |"
        )
    lines += [
        "",
        f"GET /api/models with {args.files} GGUF files: median {served:.1f} ms; "
        f"bare scandir + stat: {bare:.2f} ms (ratio {served / bare:.0f})",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
