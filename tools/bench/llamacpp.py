"""Decode speed of GGUF serving: miserver against the bare loop and llama-cpp-python's server.

    python -m tools.bench.llamacpp [--rounds 5] [--tokens 128] [--threads N]

Five paths generate greedily from the same chat prompt (SmolLM2-135M-Instruct
Q4_1, rendered with the file's chat template: the same token ids everywhere):

- `bare`: the low-level loop of `tools/bench/peer.py` (`BareLoop`: `llama_decode`
  on a one-token `llama_batch`, llama.cpp's greedy sampler reading the logits
  in place; no `create_completion`, which carries per-token costs of its own)
  in this process, on the same file with the same n_ctx, threads and flash
  attention as miserver's engine;
- `server` / `server-stream`: `POST /v1/chat/completions` to `miserver serve`
  (a subprocess on loopback serving its embedded default on llama.cpp, model
  `SmolLM2-135M-Instruct:Q4_1`), timed until the whole body, or `[DONE]`, is in;
- `llama-cpp-server` / `llama-cpp-server-stream`: llama-cpp-python's own
  server (`python -m llama_cpp.server`, needs `llama-cpp-python[server]`)
  on the same file, `POST /v1/completions` with the rendered prompt text,
  which it tokenizes to the same ids. It reports no usage when streaming, so
  its stream counts the chunks that carry text.

Sampling is greedy with nothing else on (top_k 0, min_p 0, top_p 1,
repeat_penalty 1.0). Every path keeps its KV cache between requests, so each
repeat of the prompt reuses all but its last token everywhere. n_ctx is the
file's trained context (8192) everywhere; `--threads N` sets prefill and
decode threads everywhere (default: each side's own; miserver's and the bare
loop's is one per usable physical core, `impl/engines/cores.py`). llama.cpp's
own `llama-server` is compared in `tools/bench/peer.py`. Rounds are
interleaved as in `decode.py`. The tables (markdown) go to stdout, with the
ratios server / bare (goal >= 0.97) and server / llama-cpp-server (goal >=
1.0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import llama_cpp

from miserver.engines import gguf
from miserver.engines.base import ChatPrompt
from miserver.engines.cores import usable_cores
from miserver.engines.llamacpp import chat, load_llamacpp_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common
from tools.bench.peer import BareLoop

log = logging.getLogger("bench.llamacpp")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
GREEDY: dict[str, Any] = {
    "temperature": 0,
    "top_k": 0,
    "min_p": 0,
    "top_p": 1,
    "repeat_penalty": 1.0,
}
GOALS = [
    ("server", "bare", 0.97),
    ("server-stream", "bare", 0.97),
    ("server", "llama-cpp-server", 1.0),
    ("server-stream", "llama-cpp-server-stream", 1.0),
]

Run = common.Run


def _threads(threads: int | None) -> dict[str, int]:
    return {} if threads is None else {"n_threads": threads, "n_threads_batch": threads}


def prompt(path: Path) -> tuple[list[int], str]:
    """The chat's ids and text, rendered by miserver's llama.cpp engine."""
    engine = load_llamacpp_engine(path, model_id=MODEL_ID)
    try:
        ids = engine.render_chat(ChatPrompt(MESSAGES))
        text = chat.render_text(engine.template, ChatPrompt(MESSAGES))
        if engine.tokenize(text, add_special_tokens=False) != ids:
            raise RuntimeError("the rendered text does not tokenize to the rendered ids")
    finally:
        engine.close()
    return ids, text


# -- the paths ------------------------------------------------------------------------


def llama_server_json(client: httpx.Client, base_url: str, text: str, tokens: int) -> Run:
    body = {"prompt": text, "max_tokens": tokens, "stream": False, **GREEDY}
    started = time.perf_counter()
    response = client.post(f"{base_url}/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    out = response.json()
    return Run(out["usage"]["completion_tokens"], seconds, out["choices"][0]["text"])


def llama_server_stream(client: httpx.Client, base_url: str, text: str, tokens: int) -> Run:
    body = {"prompt": text, "max_tokens": tokens, "stream": True, **GREEDY}
    parts: list[str] = []
    started = time.perf_counter()
    with client.stream("POST", f"{base_url}/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice.get("text"):
                    parts.append(choice["text"])
    seconds = time.perf_counter() - started
    return Run(len(parts), seconds, "".join(parts))


def llama_server(
    path: Path, n_ctx: int, threads: int | None
) -> contextlib.AbstractContextManager[str]:
    """`python -m llama_cpp.server` on the file, on a free loopback port."""
    port = common.free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx)]
    command += ["--verbose", "False"]
    for flag, value in _threads(threads).items():
        command += [f"--{flag}", str(value)]
    url = f"http://127.0.0.1:{port}/v1"
    return common.serving(command, url, os.environ, "llama_cpp.server")


# -- the run --------------------------------------------------------------------------


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    settings = from_env()
    path = embedded_default()
    n_ctx = gguf.facts(path).context_length
    prompt_ids, text = prompt(path)
    bare = BareLoop(path, n_ctx, threads or usable_cores(), prompt_ids)
    extra = [] if threads is None else ["--threads", str(threads)]
    with (
        common.served(work / "data", settings.cache_dir, threads, extra) as base_url,
        llama_server(path, n_ctx, threads) as llama_url,
        httpx.Client(timeout=600.0) as client,
    ):
        paths: dict[str, Callable[[], Run]] = {
            "bare": lambda: bare.run(tokens),
            "server": lambda: common.server_json(
                client, base_url, tokens, model=MODEL_ID, messages=MESSAGES
            ),
            "server-stream": lambda: common.server_stream(
                client, base_url, tokens, model=MODEL_ID, messages=MESSAGES
            ),
            "llama-cpp-server": lambda: llama_server_json(client, llama_url, text, tokens),
            "llama-cpp-server-stream": lambda: llama_server_stream(client, llama_url, text, tokens),
        }
        runs = common.interleave(paths, rounds)
    bare.close()
    return runs


def goals(runs: Mapping[str, Sequence[Run]]) -> str:
    lines = ["| ratio (median tok/s) | value | goal |", "|---|---:|---:|"]
    for path, against, goal in GOALS:
        ratio = common.median_rate(runs[path]) / common.median_rate(runs[against])
        mark = "" if ratio >= goal else " (below)"
        lines.append(f"| {path} / {against} | {ratio:.3f}{mark} | >= {goal} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="prefill and decode threads for every path (default: llama-cpp-python's)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.rounds, args.tokens, args.threads, Path(work))
    threads = args.threads or "each side's default"
    sys.stdout.write(
        f"llama-cpp-python {llama_cpp.__version__}, threads: {threads}, {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds of {args.tokens} greedy tokens\n\n"
    )
    sys.stdout.write(common.table(runs, args.tokens) + "\n" + goals(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
