"""Constrained decode speed against unconstrained, through the same server, in one run.

    python -m tools.bench.structured [--engine transformers|gguf] [--rounds 5]
        [--tokens 128] [--threads N]

Paths, each `POST /v1/chat/completions` (greedy, `max_tokens` = N, the whole
JSON body timed) to one `miserver serve` subprocess on loopback serving
SmolLM2-135M-Instruct on the chosen engine: `transformers` (the GGUF's
conversion, `SmolLM2-135M-Instruct`) or `gguf` (the file itself on
llama.cpp, `SmolLM2-135M-Instruct:Q4_1`, the default engine):

- `plain`: no `response_format` (the base);
- `json_schema`: `response_format` json_schema whose one string property has
  a `minLength` far past N tokens, so the grammar masks every one of the N
  tokens and the document never ends early;
- `json_object`: `{"type": "json_object"}` (free keys and values; may end
  early, which the table flags).

The prompt asks for an essay in JSON. The first request of each constrained
path builds llguidance's tokenizer and compiles the grammar; it is the
warm-up run, not counted. Rounds rotate the order. The table gives median
tokens/s and each path's ratio to `plain` (goal: json_schema / plain >= 0.9).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import torch

from miserver.settings import from_env
from tools.bench import common

log = logging.getLogger("bench.structured")

MODELS = {"transformers": "SmolLM2-135M-Instruct", "gguf": "SmolLM2-135M-Instruct:Q4_1"}
MESSAGES = [
    {
        "role": "user",
        "content": "Write a long essay about the history of Rome, as JSON with one key, essay.",
    }
]
ESSAY: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "essay",
        "schema": {
            "type": "object",
            "properties": {"essay": {"type": "string", "minLength": 20000}},
            "required": ["essay"],
            "additionalProperties": False,
        },
    },
}
Run = common.Run


def post(
    client: httpx.Client,
    base_url: str,
    model: str,
    tokens: int,
    response_format: Mapping[str, Any] | None,
) -> Run:
    body: dict[str, Any] = common.chat_body(model, MESSAGES, tokens, stream=False)
    if response_format is not None:
        body["response_format"] = dict(response_format)
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    reply = response.json()
    text = reply["choices"][0]["message"]["content"]
    return Run(reply["usage"]["completion_tokens"], seconds, text)


def measure(
    engine: str, rounds: int, tokens: int, threads: int | None, work: Path
) -> dict[str, list[Run]]:
    settings = from_env()
    model = MODELS[engine]
    args = ["--model", model]
    if threads is not None:
        args += ["--threads", str(threads)]
    with (
        common.served(work / "data", settings.cache_dir, threads, args) as url,
        httpx.Client(timeout=600.0) as client,
    ):
        paths: dict[str, Callable[[], Run]] = {
            "plain": lambda: post(client, url, model, tokens, None),
            "json_schema": lambda: post(client, url, model, tokens, ESSAY),
            "json_object": lambda: post(client, url, model, tokens, {"type": "json_object"}),
        }
        return common.interleave(paths, rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(MODELS), default="transformers")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=None, help="the server's threads (torch or llama.cpp)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.engine, args.rounds, args.tokens, args.threads, Path(work))
    library = (
        f"torch {torch.__version__}"
        if args.engine == "transformers"
        else f"llama-cpp-python {llama_cpp.__version__}"
    )
    sys.stdout.write(
        f"{MODELS[args.engine]} on {args.engine}, {library}, {os.cpu_count()} CPUs, "
        f"{args.rounds} rounds of {args.tokens} greedy tokens per path\n\n"
    )
    sys.stdout.write(common.table(runs, args.tokens, base="plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
