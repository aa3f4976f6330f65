"""The cluster against a single `miserver serve`, at one client (issue 49 acceptance).

    python -m tools.bench.cluster [--rounds 7] [--engine-replicas 2] [--tokens 128]
                                  [--engine-cpus 0] [--clients 8]

Both on the default model, each as its command starts it: `miserver serve`, and
`miserver cluster --engine-replicas N` (a local Ray head, the ingress, N engine
replicas and the control; `--engine-cpus 0` by default, as on this 2-core machine
the replicas share the cores; `--engine-cpus 1`, the cluster's own default, gives
each replica one CPU and so one thread). In one run, rounds interleaved (the order
rotates):

- TTFT, warm and cold (`peer.ttfts`: 10 streamed chats of 2 tokens a round;
  warm repeats one message, cold sends a fresh one each);
- one client's JSON chat of `--tokens` greedy tokens, tok/s;
- `--clients` JSON chats at once of 64 tokens each, their tokens/s over the
  round's wall (0: not measured), in rounds of their own after the others
  (interleaved between the two servers, as the others are).

Goal: TTFT through the cluster / the single server <= 1.25, the median of the
rounds' ratios. What the cluster adds is the hops: Serve's proxy, the
ingress's validation, the router, the handle's stream to the replica and back.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import httpx

from miserver.settings import from_env
from tools.bench import common, peer

GOAL = 1.25
MANY_TOKENS = 64  # each chat's, with --clients


@contextlib.contextmanager
def cluster(work: Path, replicas: int, cpus: float) -> Iterator[str]:
    """`miserver cluster` on a free loopback port, in a process group of its own (its Ray
    processes end with it); yields its /v1 base URL."""
    port = common.free_port()
    command = [
        sys.executable, "-c", "from miserver.cli import main; main()", "cluster",
        "--port", str(port), "--engine-replicas", str(replicas), "--engine-cpus", str(cpus),
        "--data-dir", str(work), "--cache-dir", str(from_env().cache_dir),
        "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        common.wait_until_up(url, process, "miserver cluster")
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[common.Run]]:
    with (
        peer.miserver(work / "single") as single,
        cluster(work / "cluster", args.engine_replicas, args.engine_cpus) as clustered,
        httpx.Client(timeout=300) as client,
        ThreadPoolExecutor(max_workers=max(1, args.clients)) as pool,
    ):
        fresh = iter(range(10**9))
        paths: dict[str, Callable[[], common.Run]] = {}
        many: dict[str, Callable[[], common.Run]] = {}
        for name, chat in (("single", single), ("cluster", clustered)):
            paths[f"{name}-warm"] = lambda chat=chat: peer.ttfts(  # type: ignore[misc]
                client, chat, lambda: peer.MESSAGES
            )
            paths[f"{name}-cold"] = lambda chat=chat: peer.ttfts(  # type: ignore[misc]
                client, chat, lambda: peer.cold(next(fresh))
            )
            paths[f"{name}-json"] = lambda chat=chat: peer.chat_json(  # type: ignore[misc]
                client, chat, peer.story(0), args.tokens
            )
            many[f"{name}-many"] = partial(
                peer.clients, pool, client, chat, MANY_TOKENS, args.clients
            )
        runs = common.interleave(paths, args.rounds)  # a warm-up round first
        if args.clients:  # after the one-client rounds, whose prompt caches they would evict
            runs |= common.interleave(many, args.rounds)
        return runs


def report(runs: dict[str, list[common.Run]], args: argparse.Namespace) -> str:
    def ratios(kind: str, of: Callable[[common.Run], float]) -> list[float]:
        pairs = zip(runs[f"cluster-{kind}"], runs[f"single-{kind}"], strict=True)
        return [of(c) / of(s) for c, s in pairs]

    def ms(kind: str) -> str:
        return " | ".join(
            f"{1000 * common.median_ttft(runs[f'{n}-{kind}']).ttft:.1f}"
            for n in ("single", "cluster")
        )

    rate = {n: common.median_rate(runs[f"{n}-json"]) for n in ("single", "cluster")}
    paths = [
        f"| TTFT warm (ms) | {ms('warm')} |",
        f"| TTFT cold (ms) | {ms('cold')} |",
        f"| JSON chat, {args.tokens} tokens (tok/s) | {rate['single']:.1f} "
        f"| {rate['cluster']:.1f} |",
    ]
    json_ratios = [1 / r for r in ratios("json", lambda r: r.rate)]
    goals = [
        peer.goal_row("TTFT cluster / single, warm", ratios("warm", lambda r: r.ttft), GOAL, True),
        peer.goal_row("TTFT cluster / single, cold", ratios("cold", lambda r: r.ttft), GOAL, True),
        peer.goal_row("JSON time cluster / single (recorded)", json_ratios, 99, True),
    ]
    if args.clients:
        many = {n: common.median_rate(runs[f"{n}-many"]) for n in ("single", "cluster")}
        paths.append(
            f"| {args.clients} clients at once, {MANY_TOKENS} tokens each (tok/s) "
            f"| {many['single']:.1f} | {many['cluster']:.1f} |"
        )
        name = f"{args.clients} clients tok/s cluster / single (recorded)"
        goals.append(peer.goal_row(name, ratios("many", lambda r: r.rate), 0))
    return "\n".join(
        [
            f"{args.rounds} rounds, {args.engine_replicas} engine replicas "
            f"(--engine-cpus {args.engine_cpus:g})",
            "",
            "| path (median of rounds) | single | cluster |",
            "|---|---:|---:|",
            *paths,
            "",
            "| goal | value | middle half of rounds | rounds met | target |",
            "|---|---:|---:|---:|---:|",
            *goals,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--engine-replicas", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--engine-cpus", type=float, default=0.0)
    parser.add_argument("--clients", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as work:
        runs = measure(args, Path(work))
    sys.stdout.write(report(runs, args) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
