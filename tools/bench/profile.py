"""Where a generation's time goes: cProfile over one 512-token choice on the default model.

    python -m tools.bench.profile [--tokens 512] [--top 15]

Loads the embedded GGUF as `miserver serve` does (its default threads and
flash attention), renders the bench's chat prompt, and runs one greedy choice
through the serial path the server runs in its engine thread
(`serving/completions/generation.run_choice`: the decode loop, sampling,
incremental detokenization, stop matching, one event per token), once to warm
up and once under cProfile. The table (markdown, to stdout) lists the
functions with the most own time and their share of the run; the share inside
`llama_decode` is how much of a token is the forward pass.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import threading
import time
from typing import Any

from miserver.engines.base import ChatPrompt, SamplingParams
from miserver.engines.llamacpp import load_llamacpp_engine
from miserver.models.registry import embedded_default
from miserver.serving.completions.generation import ChoiceEvent, ChoiceJob, run_choice

MODEL_ID = "SmolLM2-135M-Instruct:Q4_1"
MESSAGES = [{"role": "user", "content": "Write a long essay about the history of Rome."}]


def choice(engine: Any, ids: list[int], tokens: int) -> list[ChoiceEvent]:
    events: list[ChoiceEvent] = []
    params = SamplingParams(temperature=0, max_tokens=tokens)
    job = ChoiceJob(prompt_ids=ids, params=params, stop_strings=(), rng=None)
    run_choice(engine, job, threading.Event(), events.append)
    return events


def own_time_table(stats: pstats.Stats, total: float, top: int) -> str:
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)  # type: ignore[attr-defined]
    lines = ["| function | calls | own s | share |", "|---|---:|---:|---:|"]
    for (path, line, name), (_, calls, own, _cumulative, _) in rows[:top]:
        where = f"{path.rsplit('/', 1)[-1]}:{line}" if line else path
        lines.append(f"| `{name}` ({where}) | {calls} | {own:.3f} | {own / total:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    engine = load_llamacpp_engine(embedded_default(), model_id=MODEL_ID)
    try:
        ids = engine.render_chat(ChatPrompt(MESSAGES))
        choice(engine, ids, args.tokens)  # warm: the prompt is cached, as a server's would be
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        events = choice(engine, ids, args.tokens)
        profiler.disable()
        total = time.perf_counter() - started
        threads = engine.facts.threads
    finally:
        engine.close()
    stats = pstats.Stats(profiler)
    sys.stdout.write(
        f"{len(events) - 1} events, {args.tokens} tokens in {total:.2f} s "
        f"({args.tokens / total:.1f} tok/s under cProfile), {threads} threads\n\n"
    )
    sys.stdout.write(own_time_table(stats, total, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
