"""Past this machine on paper: a discrete-event simulation of a cluster's engine replicas.

    python -m tools.bench.cluster_sim [--replicas 8,16,64] [--sets 1,8,64]
        [--seconds 300] [--load 0.7] [--slo-ms 1500] [--times FILE] [--seed 0]

Issue 49 item 6. Each replica is miserver's batch as measured on this machine
(`tools/bench/service_times.py`, BENCHMARKS.md): `rows` rows; a step prefills
the prompts admitted to it (what its prompt cache does not hold, at the
measured per-token cost) and decodes the running rows, one decode per
distinct steering set among them (llama.cpp has one control vector per
context), each set after the first costing a control-vector switch. A replica
keeps prefixes in an LRU of `--cache-tokens`, under their steering set: a
conversation's last turn, and each set's system prompt.

The workload: conversations arriving as a Poisson process, each under one of
`--sets` steering sets drawn uniformly, of `TURNS` turns (a system prompt of
`SYSTEM` tokens, each turn `USER` more, `OUTPUT` tokens out), a think time
between turns; the rate puts `--load` of the cluster's unsteered capacity on
it. The routers, each seeing what Ray Serve's does (queue lengths) and what
it routed itself:

- `round-robin`: each replica in turn;
- `two-choices`: Ray Serve's default, two at random, the less busy;
- `affinity`: miserver's (`miserver.cluster.placement.ranked`): the replica
  that served the conversation's last turn, else those it sent the set's
  system prompt, those that ran the set in the last 10 s first, the least
  busy of them, never more than 2 requests past the least busy replica.

Per replicas x sets x router: TTFT p50 and p99 and goodput (output tokens/s
of the requests whose TTFT met `--slo-ms`), over the requests that arrived
after the first tenth of the run. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from miserver.cluster.placement import Candidate, ranked

SYSTEM = 300  # tokens of a steering set's system prompt
USER = 40  # tokens a turn adds
OUTPUT = 64  # tokens a turn generates
TURNS = 4
CHUNK = 256  # prompt tokens a step prefills at most (miserver's prefill-chunk)
THINK_S = 5.0  # mean think time between a reply and the next turn
STEERING_WINDOW_S = 10.0  # as router.py
# Measured on this machine (BENCHMARKS.md, "Past one machine"): the default when no --times
MEASURED = {
    "rows": 4,
    "prefill_ms_per_token": 2.951,
    "decode_ms": {"1": 8.74, "2": 13.85, "3": 18.17, "4": 21.99},
    "cvec_ms": 0.145,
}


@dataclass(frozen=True, slots=True)
class Times:
    rows: int
    prefill_ms: float  # per prompt token
    decode_ms: tuple[float, ...]  # a step of k rows: decode_ms[k - 1]
    cvec_ms: float

    @classmethod
    def read(cls, found: dict[str, object]) -> Times:
        decode = found["decode_ms"]
        assert isinstance(decode, dict)
        rows = int(str(found["rows"]))
        return cls(
            rows,
            float(str(found["prefill_ms_per_token"])),
            tuple(float(decode[str(k)]) for k in range(1, rows + 1)),
            float(str(found["cvec_ms"])),
        )

    def capacity(self) -> float:
        """Requests a second one replica finishes, every row busy and steered alike, a third
        of a prompt prefilled (the rest restored from its cache)."""
        turn = SYSTEM + USER * (TURNS + 1) / 2 + OUTPUT * (TURNS - 1) / 2
        busy_ms = OUTPUT * self.decode_ms[-1] / self.rows + turn * self.prefill_ms / 3
        return 1000.0 / busy_ms


@dataclass(slots=True)
class Request:
    conversation: int
    turn: int
    steering: int
    arrived: float
    prompt: int
    left: int = OUTPUT
    prefill: int = 0  # prompt tokens still to prefill
    first: float | None = None


@dataclass(slots=True)
class Replica:
    index: int
    cache_tokens: int
    running: list[Request] = field(default_factory=list)
    waiting: deque[Request] = field(default_factory=deque)
    stepping: bool = False
    held: OrderedDict[tuple[str, int], int] = field(default_factory=OrderedDict)
    ran: dict[int, float] = field(default_factory=dict)  # steering set -> when last
    vector: int | None = None  # the set its control vector holds

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def cached(self, request: Request) -> int:
        """Prompt tokens its cache restores for `request` (kept under the request's set)."""
        last = self.held.get(("turn", request.conversation * 100 + request.turn - 1))
        if last is not None:
            return min(last, request.prompt - 1)
        system = self.held.get(("system", request.steering))
        return min(system or 0, request.prompt - 1)

    def keep(self, key: tuple[str, int], tokens: int) -> None:
        self.held[key] = tokens
        self.held.move_to_end(key)
        while sum(self.held.values()) > self.cache_tokens:
            self.held.popitem(last=False)


Router = Callable[[Request, Sequence[Replica], float], Replica]


def round_robin() -> Router:
    turn = itertools.count()
    return lambda _r, replicas, _now: replicas[next(turn) % len(replicas)]


def two_choices(rng: random.Random) -> Router:
    def route(_r: Request, replicas: Sequence[Replica], _now: float) -> Replica:
        a, b = rng.sample(list(replicas), 2)
        return a if a.load <= b.load else b

    return route


def affinity(rng: random.Random) -> Router:
    """miserver's router: what it routed before, as router.py remembers it."""
    served: dict[int, int] = {}  # conversation -> replica of its last turn
    systems: dict[int, set[int]] = {}  # steering set -> replicas sent its system prompt
    sets: dict[int, dict[int, float]] = {}  # replica -> set -> when routed

    def route(request: Request, replicas: Sequence[Replica], now: float) -> Replica:
        candidates = []
        for replica in replicas:
            held = 0
            if served.get(request.conversation) == replica.index:
                held = 2
            elif replica.index in systems.get(request.steering, ()):
                held = 1
            when = sets.get(replica.index, {}).get(request.steering)
            recent = when is not None and now - when < STEERING_WINDOW_S
            candidates.append(Candidate(str(replica.index), replica.load, held, recent))
        first = ranked(candidates, rng)[0]
        chosen = min((replicas[int(name)] for name in first), key=lambda r: r.load)
        served[request.conversation] = chosen.index
        systems.setdefault(request.steering, set()).add(chosen.index)
        sets.setdefault(chosen.index, {})[request.steering] = now
        return chosen

    return route


ROUTERS: dict[str, Callable[[random.Random], Router]] = {
    "round-robin": lambda _rng: round_robin(),
    "two-choices": two_choices,
    "affinity": affinity,
}


@dataclass(slots=True)
class Outcome:
    ttft_ms: list[float] = field(default_factory=list)
    good_tokens: int = 0
    tokens: int = 0
    cached: int = 0
    prompt: int = 0


class Simulation:
    def __init__(
        self, times: Times, replicas: int, sets: int, router: Router, args: argparse.Namespace
    ) -> None:
        self.times = times
        self.replicas = [Replica(i, args.cache_tokens) for i in range(replicas)]
        self.sets = sets
        self.router = router
        self.rng = random.Random(args.seed)
        self.seconds = float(args.seconds)
        self.warmup = self.seconds / 10
        self.slo = args.slo_ms / 1000.0
        requests_per_s = args.load * replicas * times.capacity()
        self.conversations_per_s = requests_per_s / TURNS
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.outcome = Outcome()
        self.conversation = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), action))

    def run(self) -> Outcome:
        self.at(self.rng.expovariate(self.conversations_per_s), self.start_conversation)
        while self.events:
            self.now, _, action = heapq.heappop(self.events)
            if self.now > self.seconds * 1.5:
                break
            action()
        return self.outcome

    def start_conversation(self) -> None:
        if self.now < self.seconds:
            number = next(self.conversation)
            self.arrive(number, 0, self.rng.randrange(self.sets))
            self.at(
                self.now + self.rng.expovariate(self.conversations_per_s), self.start_conversation
            )

    def arrive(self, conversation: int, turn: int, steering: int) -> None:
        prompt = SYSTEM + USER * (turn + 1) + OUTPUT * turn
        request = Request(conversation, turn, steering, self.now, prompt)
        replica = self.router(request, self.replicas, self.now)
        replica.waiting.append(request)
        if not replica.stepping:
            self.step(replica)

    def step(self, replica: Replica) -> None:
        """One step: admit, prefill up to CHUNK prompt tokens, decode the rows past their
        prefill, one decode per steering set among them."""
        times = self.times
        while replica.waiting and len(replica.running) < times.rows:
            request = replica.waiting.popleft()
            cached = replica.cached(request)
            request.prefill = request.prompt - cached
            replica.running.append(request)
            replica.ran[request.steering] = self.now
            if request.arrived >= self.warmup:
                self.outcome.cached += cached
                self.outcome.prompt += request.prompt
        if not replica.running:
            replica.stepping = False
            return
        replica.stepping = True
        decoding = [r for r in replica.running if r.prefill == 0]
        admitted, budget, ms = [], CHUNK, 0.0
        for request in replica.running:
            if request.prefill and budget:
                taken = min(request.prefill, budget)
                request.prefill -= taken
                budget -= taken
                ms += taken * times.prefill_ms
                if request.prefill == 0:
                    admitted.append(request)
        groups: dict[int, int] = {}
        for request in decoding:
            groups[request.steering] = groups.get(request.steering, 0) + 1
        for steering, rows in groups.items():
            if steering != replica.vector:
                ms += times.cvec_ms
                replica.vector = steering
            ms += times.decode_ms[rows - 1]
        self.at(self.now + ms / 1000.0, lambda: self.stepped(replica, admitted, decoding))

    def stepped(self, replica: Replica, admitted: list[Request], decoding: list[Request]) -> None:
        for request in admitted:
            request.first = self.now
            request.left -= 1
            replica.keep(("system", request.steering), SYSTEM)
        for request in decoding:
            request.left -= 1
        for request in [r for r in replica.running if r.left <= 0]:
            replica.running.remove(request)
            self.finished(replica, request)
        self.step(replica)

    def finished(self, replica: Replica, request: Request) -> None:
        replica.keep(("turn", request.conversation * 100 + request.turn), request.prompt + OUTPUT)
        if request.arrived >= self.warmup and request.first is not None:
            ttft = request.first - request.arrived
            self.outcome.ttft_ms.append(ttft * 1000)
            self.outcome.tokens += OUTPUT
            if ttft <= self.slo:
                self.outcome.good_tokens += OUTPUT
        if request.turn + 1 < TURNS:
            then = self.now + self.rng.expovariate(1 / THINK_S)
            self.at(
                then, lambda: self.arrive(request.conversation, request.turn + 1, request.steering)
            )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def table(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.seconds} s of arrivals at {args.load:.0%} of the unsteered capacity, "
        f"TTFT SLO {args.slo_ms:.0f} ms, seed {args.seed}",
        "",
        "| replicas | steering sets | router | TTFT p50 (ms) | TTFT p99 (ms) | goodput (tok/s) "
        "| output (tok/s) | prompt cached |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['replicas']} | {row['sets']} | {row['router']} | {row['p50']:.0f} "
            f"| {row['p99']:.0f} | {row['goodput']:.0f} | {row['output']:.0f} "
            f"| {row['cached']:.0%} |"
        )
    return "\n".join(lines)


def simulate(args: argparse.Namespace, times: Times) -> list[dict[str, object]]:
    rows = []
    span = args.seconds * 0.9
    for replicas, sets, name in itertools.product(args.replicas, args.sets, ROUTERS):
        rng = random.Random(args.seed)
        outcome = Simulation(times, replicas, sets, ROUTERS[name](rng), args).run()
        rows.append(
            {
                "replicas": replicas,
                "sets": sets,
                "router": name,
                "p50": statistics.median(outcome.ttft_ms),
                "p99": percentile(outcome.ttft_ms, 0.99),
                "goodput": outcome.good_tokens / span,
                "output": outcome.tokens / span,
                "cached": outcome.cached / max(outcome.prompt, 1),
            }
        )
    return rows


def _numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=_numbers, default=[8, 16, 64])
    parser.add_argument("--sets", type=_numbers, default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--slo-ms", type=float, default=1500.0)
    parser.add_argument("--cache-tokens", type=int, default=16384)
    parser.add_argument("--times", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    found = json.loads(args.times.read_text()) if args.times else MEASURED
    sys.stdout.write(table(simulate(args, Times.read(found)), args) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
