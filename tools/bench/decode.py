"""Decode speed through the server against bare `model.generate`, in one run.

    python tools/bench/decode.py [--rounds 5] [--tokens 128] [--threads N]

Three paths generate greedily from the same chat prompt (rendered with the
model's chat template, the same token ids everywhere):

- `bare`: `model.generate(do_sample=False, max_new_tokens=N)` in this
  process, on the model miserver's transformers engine loads (the converted
  HF folder in the cache directory);
- `server`: `POST /v1/chat/completions` to `miserver serve` (a uvicorn
  subprocess on loopback), timed until the whole JSON body is in;
- `server-stream`: the same request with `stream: true`, timed until
  `data: [DONE]`.

Rounds are interleaved (the order rotates every round) so that a change in
machine load hits every path alike. Tokens/s is the completion tokens the
path reports (bare: the new ids) over the wall time of the request, prefill
included. The prompt asks for an essay that runs past N tokens greedily; a
path that stops early is flagged. The table (markdown) goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env

log = logging.getLogger("bench.decode")

MODEL_ID = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Run:
    """One timed generation: how many tokens it produced and how long it took."""

    tokens: int
    seconds: float
    text: str

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


# -- the server ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def served(data_dir: Path, cache_dir: Path, threads: int | None) -> Iterator[str]:
    """`miserver serve` on a free loopback port; yields its /v1 base URL."""
    script = shutil.which("miserver", path=str(Path(sys.executable).parent))
    command = (
        [script] if script else [sys.executable, "-c", "from miserver.cli import main; main()"]
    )
    port = _free_port()
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    args = [
        "serve",
        "--model",
        MODEL_ID,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--cache-dir",
        str(cache_dir),
    ]
    process = subprocess.Popen(
        [*command, *args, "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_up(base_url, process)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_until_up(base_url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"miserver exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"miserver did not answer within {START_TIMEOUT_S:.0f} s")


def _body(tokens: int, stream: bool) -> dict[str, object]:
    return {
        "model": MODEL_ID,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


def server_json(client: httpx.Client, base_url: str, tokens: int) -> Run:
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=_body(tokens, stream=False))
    seconds = time.perf_counter() - started
    response.raise_for_status()
    body = response.json()
    text = body["choices"][0]["message"]["content"]
    return Run(body["usage"]["completion_tokens"], seconds, text)


def server_stream(client: httpx.Client, base_url: str, tokens: int) -> Run:
    parts: list[str] = []
    completion = 0
    started = time.perf_counter()
    with client.stream(
        "POST", f"{base_url}/chat/completions", json=_body(tokens, stream=True)
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                parts.append(choice["delta"].get("content") or "")
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
    seconds = time.perf_counter() - started
    return Run(completion, seconds, "".join(parts))


# -- bare transformers ---------------------------------------------------------------


def bare(engine: TransformersEngine, prompt_ids: list[int], tokens: int) -> Run:
    model = engine.model
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=tokens,
            pad_token_id=engine.tokenizer.eos_token_id,
        )
    seconds = time.perf_counter() - started
    new_ids = output[0, len(prompt_ids) :].tolist()
    return Run(len(new_ids), seconds, engine.decode(new_ids))


# -- the run -------------------------------------------------------------------------


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    settings = from_env()
    engine = load_transformers_engine(
        embedded_default(), model_id=MODEL_ID, cache_dir=settings.cache_dir
    )
    prompt_ids = engine.render_chat(ChatPrompt(MESSAGES))
    with (
        served(work / "data", settings.cache_dir, threads) as base_url,
        httpx.Client(timeout=600.0) as client,
    ):
        paths: dict[str, Callable[[], Run]] = {
            "bare": lambda: bare(engine, prompt_ids, tokens),
            "server": lambda: server_json(client, base_url, tokens),
            "server-stream": lambda: server_stream(client, base_url, tokens),
        }
        for run in paths.values():  # warm-up, not counted
            run()
        runs: dict[str, list[Run]] = {name: [] for name in paths}
        names = list(paths)
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                runs[name].append(paths[name]())
                log.info("round %d %-13s %6.1f tok/s", i + 1, name, runs[name][-1].rate)
    engine.close()
    return runs


def table(runs: dict[str, list[Run]], tokens: int) -> str:
    base = statistics.median(r.rate for r in runs["bare"])
    reference = runs["bare"][0].text
    lines = [
        "| path | median tok/s | min | max | median wall (s) | tokens | same text as bare "
        "| ratio to bare |",
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
            f"| {statistics.median(rates) / base:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for both (default: torch's)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.rounds, args.tokens, args.threads, Path(work))
    sys.stdout.write(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {args.rounds} rounds of {args.tokens} greedy tokens\n\n"
    )
    sys.stdout.write(table(runs, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
