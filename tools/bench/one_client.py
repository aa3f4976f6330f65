"""One client on miserver as started against miserver started with other flags, and the bare loop.

    python -m tools.bench.one_client --rounds 11 [--flags "--parallel 1"]

Two servers side by side, one as the README starts it and one with `--flags`
(by default `--parallel 1`: the serial path, where one client decoded before
batching became the default), and `peer.BareLoop` beside them, each sent the
peer bench's chat for `--tokens` greedy tokens, JSON and stream, in one run
with mirrored rounds (`common.mirrored`): each ratio compares two paths run
back to back. What it answers: what one client pays for decoding as a row of
the batch instead of alone (issue 43), with the machine's drift cancelled as
far as one run can.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import httpx

from miserver.engines import gguf
from miserver.engines.cores import usable_cores
from miserver.models.registry import embedded_default
from tools.bench import common, peer


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[common.Run]]:
    path = embedded_default()
    bare = peer.BareLoop(
        path, gguf.facts(path).context_length, usable_cores(), peer.prompt_ids(path)
    )
    flags = shlex.split(args.flags)
    try:
        with contextlib.ExitStack() as stack:
            ours = stack.enter_context(peer.miserver(work / "default"))
            other = stack.enter_context(peer.miserver(work / "flags", flags))
            client = stack.enter_context(httpx.Client(timeout=600.0))
            json, stream = peer.chat_json, peer.chat_stream
            paths = {
                "default": partial(json, client, ours, peer.MESSAGES, args.tokens),
                "flags": partial(json, client, other, peer.MESSAGES, args.tokens),
                "bare": partial(bare.run, args.tokens),
                "flags-stream": partial(stream, client, other, peer.MESSAGES, args.tokens),
                "default-stream": partial(stream, client, ours, peer.MESSAGES, args.tokens),
            }
            for run in paths.values():  # each path warmed: its prompt cached, its code loaded
                run()
            return common.mirrored(paths, args.rounds)
    finally:
        bare.close()


def report(runs: dict[str, list[common.Run]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.rounds} rounds of {args.tokens} greedy tokens, one client; "
        f"`flags`: miserver with `{args.flags}`",
        "",
        common.table(runs, args.tokens),
        "| ratio (median of the rounds' ratios) | value | middle half of rounds |",
        "|---|---:|---:|",
    ]
    pairs = [
        ("default", "flags"),
        ("default-stream", "flags-stream"),
        ("default", "bare"),
        ("default-stream", "bare"),
        ("flags", "bare"),
        ("flags-stream", "bare"),
    ]
    for path, against in pairs:
        ratios = peer.paired(runs, path, against)
        value = statistics.median(ratios)
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [value] * 3
        lines.append(f"| {path} / {against} | {value:.3f} | {low:.3f}-{high:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--flags", default="--parallel 1", help="the second server's flags")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="miserver-one-client-") as work:
        runs = measure(args, Path(work))
    sys.stdout.write(report(runs, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
