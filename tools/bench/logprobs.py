"""What token log-probabilities cost through the server, on both engines, in one run.

    python -m tools.bench.logprobs [--rounds 5] [--tokens 128] [--threads N]

Two `miserver serve` subprocesses on loopback, one per engine: transformers
(`--model SmolLM2-135M-Instruct`) and llama.cpp (no `--model`: the embedded
GGUF, model `SmolLM2-135M-Instruct:Q4_1`). Issue 42's two goals, per engine:

1. Decode. `POST /v1/chat/completions`, greedy (temperature 0), the chat of
   `decode.py` (an essay that runs past N tokens), `max_tokens` N, JSON,
   timed until the whole body is in: `plain` as is, `logprobs` with
   `logprobs: true, top_logprobs: 5` (each reply is checked to carry one
   entry per completion token). Tokens/s is completion tokens over the
   request's wall time. Goal: logprobs / plain >= 0.95.
2. Echo scoring. `POST /v1/completions` with a token-id prompt of exactly 512
   ids (the start of `scoring.judge_prompt`'s text, SmolLM2's tokenizer, no
   special tokens; the same ids on both engines, whose vocabularies are the
   same), `echo: true, logprobs: 1, max_tokens: 0` (`echo`; the reply is
   checked: 512 prompt tokens, 512 entries, nothing generated), against a bare
   forward of the same ids in this process (`bare`):
   - llama.cpp: llama-cpp-python's low-level API on the same file with the
     server's settings (n_ctx the file's trained context, n_threads and
     n_threads_batch one per usable physical core or `--threads`, n_batch 512,
     flash attention on): the KV cache cleared, the 512 ids put in a
     `llama_batch` with `logits` set for every position and run by
     `llama_decode` in chunks of n_batch (one here), each chunk's logits rows
     ([n, vocab] float32, from `llama_get_logits`) then copied into a float32
     array of [512, vocab] allocated once, as llama-cpp-python's `Llama.eval`
     copies them into its scores with `logits_all`. No log-softmax, no top-k.
   - transformers: `model(input_ids=[512 ids], use_cache=False)` under
     `torch.inference_mode()` on the model the server's engine loads (float32
     on CPU; torch threads as the server sets them), every position's logits
     kept (`logits_to_keep` left at 0), as float32. No log-softmax, no top-k.
   Both sides time the whole call (the server's: HTTP, JSON, log-softmax and
   top-1 of 511 positions included). Goal: echo / bare <= 1.15 (in time).

Each compared pair runs in a block of `common.mirrored` rounds of its own
(after a warm-up of each path; the pair's order swapped every other round):
transformers plain and logprobs, then llama.cpp's, then transformers bare and
echo, then llama.cpp's. No other path runs inside a pair's block: when the
paths of all four pairs ran in one round, the first of a pair ran straight
after another engine's work (the transformers server's decode, or this
process's own torch forward) and took that work's tail on the two cores (the
llama.cpp decode pair measured 0.845-0.918 in the rounds where logprobs went
first, 0.861-0.992 where plain did, in one run). A goal is the median over
rounds of the pair's ratio within a round (`peer.goal_row`). The tables
(markdown) go to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import numpy.typing as npt
import torch

from miserver.engines import gguf
from miserver.engines.base import LoadOptions
from miserver.engines.cores import usable_cores
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common
from tools.bench.bare_batch import put
from tools.bench.peer import goal_row, paired
from tools.bench.scoring import judge_prompt

log = logging.getLogger("bench.logprobs")

HF_ID = "SmolLM2-135M-Instruct"
GGUF_ID = f"{HF_ID}:Q4_1"
ENGINES = {"transformers": HF_ID, "llama.cpp": GGUF_ID}
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
TOP_LOGPROBS = 5
PROMPT_IDS = 512
N_BATCH = 512  # miserver's llama.cpp n_batch (llama-cpp-python's own default)
DECODE_GOAL = 0.95
ECHO_GOAL = 1.15

Run = common.Run


# -- the server's paths ---------------------------------------------------------------


def chat(client: httpx.Client, base_url: str, model: str, tokens: int, logprobs: bool) -> Run:
    """One greedy JSON chat of `tokens` tokens; with `logprobs`, each token's and its 5 best."""
    body = common.chat_body(model, MESSAGES, tokens, stream=False)
    if logprobs:
        body |= {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    out = response.json()
    choice, made = out["choices"][0], out["usage"]["completion_tokens"]
    if logprobs and len(choice["logprobs"]["content"]) != made:
        raise RuntimeError(f"{model}: {made} tokens but not one logprobs entry each")
    return Run(made, seconds, choice["message"]["content"])


def echo(client: httpx.Client, base_url: str, model: str, ids: Sequence[int]) -> Run:
    """lm-eval's log-likelihood of the prompt: echo, logprobs 1, nothing generated."""
    body = {"model": model, "prompt": list(ids), "echo": True, "logprobs": 1, "max_tokens": 0}
    started = time.perf_counter()
    response = client.post(f"{base_url}/completions", json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    out = response.json()
    usage, logprobs = out["usage"], out["choices"][0]["logprobs"]
    if usage["prompt_tokens"] != len(ids) or usage["completion_tokens"] != 0:
        raise RuntimeError(f"{model}: scored {usage} for a prompt of {len(ids)} ids")
    if len(logprobs["token_logprobs"]) != len(ids):
        raise RuntimeError(f"{model}: {len(logprobs['token_logprobs'])} entries, not {len(ids)}")
    return Run(len(ids), seconds, "")


# -- the bare forwards ----------------------------------------------------------------


def bare_transformers(engine: TransformersEngine, ids: Sequence[int]) -> Run:
    """Every position's logits of `ids`, no cache, float32."""
    input_ids = torch.tensor([list(ids)], dtype=torch.long)
    started = time.perf_counter()
    with torch.inference_mode():
        logits = engine.model(input_ids=input_ids, use_cache=False).logits.float()
    seconds = time.perf_counter() - started
    if tuple(logits.shape[:2]) != (1, len(ids)):
        raise RuntimeError(f"logits of shape {tuple(logits.shape)}")
    return Run(len(ids), seconds, "")


class BareForward:
    """llama.cpp's forward of a prompt with every position's logits, read into one array."""

    def __init__(self, path: Path, window: int, threads: int, n_ids: int) -> None:
        self.llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=window,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=N_BATCH,
            flash_attn=True,
            verbose=False,
        )
        self.ctx = self.llama.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = int(self.llama.n_vocab())
        self.batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self.out: npt.NDArray[np.float32] = np.empty((n_ids, self.n_vocab), np.float32)

    def _rows(self, n: int) -> npt.NDArray[np.float32]:
        """The last batch's `n` logits rows, a view of llama.cpp's buffer."""
        address = ctypes.cast(llama_cpp.llama_get_logits(self.ctx), ctypes.c_void_p).value
        if not address:
            raise RuntimeError("llama.cpp holds no logits")
        block = (ctypes.c_float * (n * self.n_vocab)).from_address(address)
        return np.frombuffer(memoryview(block), dtype=np.float32).reshape(n, self.n_vocab)

    def run(self, ids: Sequence[int]) -> Run:
        started = time.perf_counter()
        llama_cpp.llama_memory_clear(self.memory, True)
        for first in range(0, len(ids), N_BATCH):
            chunk = ids[first : first + N_BATCH]
            for j, token in enumerate(chunk):
                put(self.batch, j, token, first + j, 0, True)
            self.batch.n_tokens = len(chunk)
            if llama_cpp.llama_decode(self.ctx, self.batch) != 0:
                raise RuntimeError("llama_decode failed")
            np.copyto(self.out[first : first + len(chunk)], self._rows(len(chunk)))
        return Run(len(ids), time.perf_counter() - started, "")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        self.llama.close()


# -- the run --------------------------------------------------------------------------


def prompt_ids(engine: TransformersEngine) -> list[int]:
    ids = engine.tokenize(judge_prompt(PROMPT_IDS), add_special_tokens=False)[:PROMPT_IDS]
    if len(ids) != PROMPT_IDS:
        raise RuntimeError(f"the judge prompt has only {len(ids)} tokens")
    return ids


@contextlib.contextmanager
def servers(work: Path, threads: int | None) -> Iterator[dict[str, str]]:
    """engine -> the /v1 base URL of a `miserver serve` on it."""
    settings = from_env()
    extra = [] if threads is None else ["--threads", str(threads)]
    with (
        common.served(work / "hf", settings.cache_dir, threads, ["--model", HF_ID, *extra]) as hf,
        common.served(work / "gguf", settings.cache_dir, threads, extra) as gguf_url,
    ):
        yield {"transformers": hf, "llama.cpp": gguf_url}


def measure(rounds: int, tokens: int, threads: int | None, work: Path) -> dict[str, list[Run]]:
    settings = from_env()
    path = embedded_default()
    engine = load_transformers_engine(
        path,
        model_id=HF_ID,
        cache_dir=settings.cache_dir,
        options=LoadOptions(threads=threads or 0),
    )
    ids = prompt_ids(engine)
    forward = BareForward(
        path, gguf.facts(path).context_length, threads or usable_cores(), len(ids)
    )
    try:
        with servers(work, threads) as urls, httpx.Client(timeout=600.0) as client:
            pairs: list[dict[str, Callable[[], Run]]] = []
            for name, model in ENGINES.items():
                url = urls[name]
                pairs.append(
                    {
                        f"{name} plain": lambda url=url, model=model: chat(
                            client, url, model, tokens, logprobs=False
                        ),
                        f"{name} logprobs": lambda url=url, model=model: chat(
                            client, url, model, tokens, logprobs=True
                        ),
                    }
                )
            pairs.append(
                {
                    "transformers bare": lambda: bare_transformers(engine, ids),
                    "transformers echo": lambda: echo(client, urls["transformers"], HF_ID, ids),
                }
            )
            pairs.append(
                {
                    "llama.cpp bare": lambda: forward.run(ids),
                    "llama.cpp echo": lambda: echo(client, urls["llama.cpp"], GGUF_ID, ids),
                }
            )
            runs: dict[str, list[Run]] = {}
            for pair in pairs:  # a block of rounds each: no other path runs between or before
                runs |= common.mirrored(pair, rounds)
            return runs
    finally:
        forward.close()
        engine.close()


def ms_table(runs: Mapping[str, Sequence[Run]]) -> str:
    """Each echo path against its engine's bare forward, in milliseconds."""
    lines = [
        "| engine | bare median ms | echo median ms | echo min | echo max | echo / bare |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ENGINES:
        bare = statistics.median(r.seconds for r in runs[f"{name} bare"]) * 1000
        found = [r.seconds * 1000 for r in runs[f"{name} echo"]]
        median = statistics.median(found)
        lines.append(
            f"| {name} | {bare:.1f} | {median:.1f} | {min(found):.1f} | {max(found):.1f} "
            f"| {median / bare:.3f} |"
        )
    return "\n".join(lines) + "\n"


def report(runs: Mapping[str, Sequence[Run]], rounds: int, tokens: int) -> str:
    threads = torch.get_num_threads()
    parts = [
        f"torch {torch.__version__} ({threads} threads in this process), llama-cpp-python "
        f"{llama_cpp.__version__}, {os.cpu_count()} CPUs ({usable_cores()} usable cores), "
        f"{rounds} rounds of {tokens} greedy tokens, an echo of {PROMPT_IDS} ids",
        "",
    ]
    for name in ENGINES:
        subset = {path: runs[f"{name} {path}"] for path in ("plain", "logprobs")}
        parts += [f"Decode, {name}:", "", common.table(subset, tokens, base="plain")]
    parts += [f"Echo scoring of {PROMPT_IDS} ids:", "", ms_table(runs)]
    parts += [
        "Goals, each the median over rounds of the ratio within a round:",
        "",
        "| goal | value | middle half of rounds | rounds met | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in ENGINES:
        ratios = paired(runs, f"{name} logprobs", f"{name} plain")
        parts.append(goal_row(f"{name} decode, logprobs / plain", ratios, DECODE_GOAL))
    for name in ENGINES:
        # bare's rate / echo's, the same 512 tokens each: echo's time / bare's
        ratios = paired(runs, f"{name} bare", f"{name} echo")
        parts.append(goal_row(f"{name} echo / bare (time)", ratios, ECHO_GOAL, at_most=True))
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for both servers and both bare forwards (default: one per usable core)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-bench-") as work:
        runs = measure(args.rounds, args.tokens, args.threads, Path(work))
    sys.stdout.write(report(runs, args.rounds, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
