"""What the benchmarks share: servers on loopback, timed requests, interleaved rounds, tables.

- `served(...)`: `miserver serve` as a subprocess on a free loopback port
  (`served_process` yields its process too); `serving(command, base_url, ...)`
  does the same for any server command (`spawned` yields its process).
- `server_json` / `server_stream`: one greedy chat completion, timed until
  the whole body, or `data: [DONE]`, is in.
- `interleave(paths, rounds)`: a warm-up of every path, then rounds whose
  order rotates, so a change in machine load hits every path alike.
- `mirrored(paths, rounds)`: the same, but every round runs the paths in
  the order given, backwards every other round, so that two paths given
  side by side always run one right after the other (for ratios within a
  round: the machine's speed drifts within seconds).
- `table(runs, tokens, base)`: the markdown table, with ratios to `base`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("bench")

START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Run:
    """One timed generation: how many tokens it produced and how long it took."""

    tokens: int
    seconds: float
    text: str
    ttft: float = 0.0  # a stream's seconds to its first content (0: not streamed)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def median_ttft(runs: Sequence[Run]) -> Run:
    """Streamed runs as one: their median time to first content, tokens and seconds summed."""
    ttft = statistics.median(r.ttft for r in runs)
    return Run(sum(r.tokens for r in runs), sum(r.seconds for r in runs), "", ttft)


# -- servers ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(
    command: Sequence[str], base_url: str, env: Mapping[str, str], name: str
) -> Iterator[str]:
    """Run `command` (a server) until the block ends; yields `base_url` once it answers."""
    with spawned(command, base_url, env, name):
        yield base_url


@contextlib.contextmanager
def spawned(
    command: Sequence[str], base_url: str, env: Mapping[str, str], name: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`serving`, yielding the server's process (for its PID) once it answers."""
    process = subprocess.Popen(
        list(command), env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until_up(base_url, process, name)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def served(
    data_dir: Path, cache_dir: Path, threads: int | None, args: Sequence[str] = ()
) -> Iterator[str]:
    """`miserver serve` on a free loopback port; yields its /v1 base URL."""
    with served_process(data_dir, cache_dir, threads, args) as (base_url, _):
        yield base_url


@contextlib.contextmanager
def served_process(
    data_dir: Path, cache_dir: Path, threads: int | None, args: Sequence[str] = ()
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`served`, yielding its /v1 base URL and the server's process."""
    script = shutil.which("miserver", path=str(Path(sys.executable).parent))
    command = (
        [script] if script else [sys.executable, "-c", "from miserver.cli import main; main()"]
    )
    port = free_port()
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    serve = ["serve", "--port", str(port), "--data-dir", str(data_dir)]
    serve += ["--cache-dir", str(cache_dir), *args]
    base_url = f"http://127.0.0.1:{port}/v1"
    command = [*command, *serve, "--log-level", "warning"]
    with spawned(command, base_url, env, "miserver") as process:
        yield base_url, process


def wait_until_up(base_url: str, process: subprocess.Popen[bytes], name: str = "miserver") -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"{name} did not answer within {START_TIMEOUT_S:.0f} s")


# -- timed requests ----------------------------------------------------------------


def chat_body(
    model: str, messages: Sequence[Mapping[str, Any]], tokens: int, stream: bool
) -> dict[str, object]:
    return {
        "model": model,
        "messages": list(messages),
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


def server_json(
    client: httpx.Client,
    base_url: str,
    tokens: int,
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]],
) -> Run:
    started = time.perf_counter()
    response = client.post(
        f"{base_url}/chat/completions", json=chat_body(model, messages, tokens, stream=False)
    )
    seconds = time.perf_counter() - started
    response.raise_for_status()
    body = response.json()
    text = body["choices"][0]["message"]["content"]
    return Run(body["usage"]["completion_tokens"], seconds, text)


def server_stream(
    client: httpx.Client,
    base_url: str,
    tokens: int,
    *,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    include_usage: bool = False,
) -> Run:
    """`include_usage` asks for the usage chunk (`stream_options`), which a server other
    than miserver may only send when asked."""
    parts: list[str] = []
    completion = 0
    ttft = 0.0
    started = time.perf_counter()
    body = chat_body(model, messages, tokens, stream=True)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                content = choice["delta"].get("content") or ""
                if content and not ttft:
                    ttft = time.perf_counter() - started
                parts.append(content)
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
    seconds = time.perf_counter() - started
    return Run(completion, seconds, "".join(parts), ttft)


# -- rounds and tables -------------------------------------------------------------


def interleave(paths: Mapping[str, Callable[[], Run]], rounds: int) -> dict[str, list[Run]]:
    """A warm-up run of every path (not counted), then `rounds` rotating rounds."""
    return _rounds(
        paths, rounds, lambda names, i: names[i % len(names) :] + names[: i % len(names)]
    )


def mirrored(paths: Mapping[str, Callable[[], Run]], rounds: int) -> dict[str, list[Run]]:
    """A warm-up run of every path (not counted), then `rounds` rounds in `paths`' order,
    every other one backwards: neighbours in `paths` run back to back, each first in half
    the rounds."""
    return _rounds(paths, rounds, lambda names, i: names if i % 2 == 0 else names[::-1])


def _rounds(
    paths: Mapping[str, Callable[[], Run]],
    rounds: int,
    order: Callable[[list[str], int], list[str]],
) -> dict[str, list[Run]]:
    """A warm-up run of every path, then `rounds` rounds, round i in `order(names, i)`."""
    for run in paths.values():
        run()
    runs: dict[str, list[Run]] = {name: [] for name in paths}
    names = list(paths)
    width = max(len(name) for name in names)
    for i in range(rounds):
        for name in order(names, i):
            runs[name].append(paths[name]())
            log.info("round %d %-*s %6.1f tok/s", i + 1, width, name, runs[name][-1].rate)
    return runs


def median_rate(runs: Sequence[Run]) -> float:
    return statistics.median(r.rate for r in runs)


def table(runs: Mapping[str, Sequence[Run]], tokens: int, base: str = "bare") -> str:
    """Rates per path; `same text` and `ratio` compare each path with `base`."""
    reference = runs[base][0].text
    base_rate = median_rate(runs[base])
    lines = [
        f"| path | median tok/s | min | max | median wall (s) | tokens | same text as {base} "
        f"| ratio to {base} |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, found in runs.items():
        rates = [r.rate for r in found]
        counts = sorted({r.tokens for r in found})
        same = all(r.text == reference for r in found)
        flag = "" if counts == [tokens] else " (stopped early)"
        lines.append(
            f"| {name} | {statistics.median(rates):.1f} | {min(rates):.1f} | {max(rates):.1f} "
            f"| {statistics.median(r.seconds for r in found):.2f} "
            f"| {'/'.join(map(str, counts))}{flag} | {'yes' if same else 'no'} "
            f"| {statistics.median(rates) / base_rate:.3f} |"
        )
    return "\n".join(lines) + "\n"
