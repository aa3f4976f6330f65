"""Hostile requests against the server: no 5xx, fast refusals, the model untouched.

    python -m tools.bench.fuzz [--count 10000] [--seed 24] [--threads 1]

`miserver serve` with no `--model` (the embedded GGUF on llama.cpp, `--threads`
compute threads, one by default: the bench's client shares a small machine;
`--default-max-tokens 16`, so that a mutation that mangles `max_tokens` away
asks for 16 tokens, not 512), a subprocess on loopback with `--hf-endpoint`
on an empty fake site on loopback (tools/fakehub.py: no request leaves the
machine), gets `--count` requests one at a time: the whole hostile corpus
(tests/data/hostile/, every case on every route it names), then seeded random
mutations of the targets' base bodies (tools/hostile/mutate.py: byte flips,
cuts, type swaps, deep nesting, lone surrogates, names twice, numbers out of
range, random bytes) up to the count. The same seed sends the same requests.

The tables give the count by status, the 5xx count (goal 0), the median and
p99 time to a refusal (a 4xx; HTTP included; goal: median <= 5 ms) per source
and per mutation, the corpus cases that broke their expected outcome, and
whether a greedy reply after the run equals the one before, byte for byte.
"""

from __future__ import annotations

import argparse
import collections
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from miserver.settings import from_env
from tools.bench import common
from tools.fakehub import Hub, serve_hub
from tools.hostile import client, corpus, mutate
from tools.hostile.corpus import Request

log = logging.getLogger("bench.fuzz")

SLOWEST = 10  # the slowest requests, listed by name
DEFAULT_MAX_TOKENS = 16  # for a mutation that mangled `max_tokens` away (the server's is 512)


@dataclass(frozen=True, slots=True)
class Sent:
    """One request's source (`corpus` or `mutation`), kind (family or operator) and answer."""

    source: str
    kind: str
    label: str
    status: int | None
    seconds: float
    broken: bool  # a corpus case whose expected outcome did not hold


def requests(count: int, seed: int) -> list[Request]:
    found = [r for family in corpus.families() for r in corpus.requests(family)]
    return found[:count] + list(mutate.mutations(max(0, count - len(found)), seed))


def run(http: httpx.Client, origin: str, planned: Sequence[Request]) -> list[Sent]:
    sent: list[Sent] = []
    started = time.perf_counter()
    for i, request in enumerate(planned, 1):
        outcome = client.send(http, origin, request)
        mutation = request.case.family.startswith("mutation:")
        broken = not mutation and bool(client.problems(request, outcome))
        kind = request.case.family.removeprefix("mutation:")
        source = "mutation" if mutation else "corpus"
        sent.append(Sent(source, kind, request.label, outcome.status, outcome.seconds, broken))
        if outcome.status is not None and outcome.status >= 500:
            log.error("5xx: %s got %d", request.label, outcome.status)
        if i % 1000 == 0:
            log.info("%d requests, %.0f s", i, time.perf_counter() - started)
    return sent


def _ms(values: Iterable[float]) -> list[float]:
    return sorted(v * 1000 for v in values)


def _p99(ms: Sequence[float]) -> float:
    return ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def refusal_row(label: str, sent: Sequence[Sent]) -> str:
    ms = _ms(s.seconds for s in sent if s.status is not None and 400 <= s.status < 500)
    if not ms:
        return f"| {label} | {len(sent)} | 0 | - | - | - |"
    return (
        f"| {label} | {len(sent)} | {len(ms)} | {statistics.median(ms):.2f} | {_p99(ms):.2f} "
        f"| {ms[-1]:.0f} |"
    )


def tables(sent: Sequence[Sent], same: bool, seconds: float) -> str:
    by_status = collections.Counter(s.status for s in sent)
    spent: dict[int | None, float] = collections.defaultdict(float)
    for s in sent:
        spent[s.status] += s.seconds
    fives = sum(n for status, n in by_status.items() if status is not None and status >= 500)
    lines = [
        f"{len(sent)} requests in {seconds:.0f} s; 5xx: {fives}; "
        f"greedy reply after the run identical to before: {'yes' if same else 'no'}; "
        f"corpus cases off their expected outcome: {sum(s.broken for s in sent)}",
        "",
        "| status | requests | seconds spent |",
        "|---|---:|---:|",
        *(
            f"| {'none (client hung up)' if status is None else status} | {n} "
            f"| {spent[status]:.1f} |"
            for status, n in sorted(by_status.items(), key=lambda kv: kv[0] or 0)
        ),
        "",
        "| requests | sent | refused (4xx) | median refusal ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
        refusal_row("all", sent),
        *(refusal_row(source, _of(sent, source=source)) for source in ("corpus", "mutation")),
        *(refusal_row(f"mutation: {op}", _of(sent, kind=op)) for op in mutate.OPERATORS),
        "",
        "| slowest requests | status | ms |",
        "|---|---:|---:|",
        *(
            f"| {s.label} | {s.status} | {s.seconds * 1000:.0f} |"
            for s in sorted(sent, key=lambda s: -s.seconds)[:SLOWEST]
        ),
    ]
    return "\n".join(lines) + "\n"


def _of(sent: Sequence[Sent], **match: str) -> list[Sent]:
    return [s for s in sent if all(getattr(s, k) == v for k, v in match.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1, help="the server's compute threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    planned = requests(args.count, args.seed)
    serve = ["--threads", str(args.threads), "--default-max-tokens", str(DEFAULT_MAX_TOKENS)]
    model = corpus.model()
    with (
        serve_hub(Hub()) as site,  # /api/hf on loopback: a site that has none of the repos
        tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp,
        common.served(
            Path(tmp) / "data", from_env().cache_dir, args.threads, [*serve, "--hf-endpoint", site]
        ) as base_url,
        httpx.Client() as http,
    ):
        origin = base_url.removesuffix("/v1")
        before = client.greedy(http, origin, model)
        started = time.perf_counter()
        sent = run(http, origin, planned)
        seconds = time.perf_counter() - started
        same = client.greedy(http, origin, model) == before
    sys.stdout.write(tables(sent, same, seconds))
    fives = sum(1 for s in sent if s.status is not None and s.status >= 500)
    return 1 if fives or not same else 0


if __name__ == "__main__":
    sys.exit(main())
