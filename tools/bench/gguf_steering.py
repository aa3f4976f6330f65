"""Steering and reading on llama.cpp (issue 46): against plain decode on the GGUF, in one run.

    python -m tools.bench.gguf_steering [--rounds 5] [--tokens 128] [--threads N]

Greedy generation of `--tokens` tokens per sequence on SmolLM2's Q4_1 GGUF, on
the llama.cpp engine loaded with 8 rows, steered by the SAE the tests train
and cache (`tools/sae_train.py`) through the context's control vector:

- `bare`: llama.cpp's decode loop with nothing around it (`peer.BareLoop`, a
  context with no evaluation callback) on a fresh prompt, for the cost of the
  serial path's idle tap (tap.py) and everything else the engine does;
- `serial` / `serial-steered`: one generation on the serial path, without and
  with a three-feature steering (goal: steered / unsteered >= 0.95);
- `rows` / `rows-same` / `rows-distinct`: 8 generations as rows of the batch,
  stepped together, unsteered, all 8 with the same steering (one decode a
  step), and each with its own (8 decodes a step: the cost of distinct
  steerings, recorded);
- `serial-reading`: the serial path capturing layer 12 (activations; goal:
  reading / plain >= 0.9); `serial-probe` and `rows-probed`: a probe monitor
  reading layer 12 on the serial path and on each of 8 rows (the layer's rows
  copied out at every pass through the context's evaluation callback).

Every generation gets a fresh prompt (a round number in it), so none reuses a
KV prefix another filled. Rounds are interleaved (the order rotates). The
markdown table goes to stdout with each path's ratio to its unsteered base.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from miserver.engines.base import (
    BatchRow,
    Capture,
    ChatPrompt,
    Hooks,
    Joiner,
    LoadOptions,
    SamplingParams,
    Token,
)
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from miserver.engines.monitor import Detector, Monitor
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.source import FixedSource
from tools.bench import common
from tools.bench.common import Run
from tools.bench.peer import BareLoop
from tools.bench.steering import FEATURES, server_bench_main, table, trained_sae
from tools.sae_train import smollm2_gguf

log = logging.getLogger("bench.gguf_steering")

ROWS = 8
BASES = {
    "serial": "bare",
    "serial-steered": "serial",
    "serial-reading": "serial",
    "serial-probe": "serial",
    "rows-same": "rows",
    "rows-distinct": "rows",
    "rows-probed": "rows",
}
LAYER = 12  # the trained SAE's layer


def prompt(engine: LlamaCppEngine, round_: int) -> list[int]:
    chat = ChatPrompt(({"role": "user", "content": f"Essay {round_}: the history of Rome."},))
    return engine.render_chat(chat)


def serial(engine: LlamaCppEngine, round_: int, tokens: int, hooks: Hooks) -> Run:
    ids = prompt(engine, round_)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, logit_bias=no_eos(engine))
    started = time.perf_counter()
    count = sum(isinstance(t, Token) for t in engine.generate(ids, params, None, hooks))
    return Run(count, time.perf_counter() - started, "")


def rows(engine: LlamaCppEngine, first: int, tokens: int, hooks: list[Hooks]) -> Run:
    """`len(hooks)` generations joined together and stepped until each has `tokens`."""
    batch = engine.batch
    assert batch is not None
    params = SamplingParams(max_tokens=tokens, temperature=0.0, logit_bias=no_eos(engine))
    joiners = [Joiner(prompt(engine, first + i), params, None, h) for i, h in enumerate(hooks)]
    started = time.perf_counter()
    joined = batch.join_all(joiners)
    live: list[BatchRow] = []
    for row in joined:
        if isinstance(row, Exception):
            raise row
        live.append(row)
    count = {id(row): 1 for row in live}
    while live:
        batch.step(live)
        for row in list(live):
            count[id(row)] += 1
            if count[id(row)] >= row.budget:
                batch.leave(row)
                live.remove(row)
    return Run(sum(count.values()), time.perf_counter() - started, "")


def no_eos(engine: LlamaCppEngine) -> tuple[tuple[int, float], ...]:
    """Every end-of-generation id banned: each generation runs its whole budget."""
    return tuple((i, -100.0) for i in engine.facts.eog_ids)


def measure(rounds: int, tokens: int, threads: int | None, _work: Path) -> dict[str, list[Run]]:
    """Every path's runs, interleaved (`threads`: llama.cpp's; None: the cores')."""
    sae, _ = trained_sae()
    options = LoadOptions(threads=threads or 0, ctx_size=ROWS * (tokens + 64), parallel=ROWS)
    engine = load_llamacpp_engine(smollm2_gguf(), model_id="bench", options=options)

    def steering(shift: int = 0) -> Hooks:
        features = {index + shift: strength for index, strength in FEATURES.items()}
        return Hooks(
            steering=FixedSource(snapshot([applied_sae("inline", sae, sae.layer, features)]))
        )

    def reading() -> Hooks:
        return Hooks(capture=Capture(LAYER, pre_steering=False))

    def probe() -> Hooks:
        detector = Detector(layer=LAYER, values=lambda rows: rows.sum(dim=1))
        return Hooks(monitor=Monitor([detector]))

    counter = itertools.count()
    loop = BareLoop(smollm2_gguf(), options.ctx_size, engine.facts.threads, [0])

    def bare() -> Run:
        loop.prompt, loop.cached = prompt(engine, fresh()), 0
        return loop.run(tokens)

    def fresh() -> int:
        """The first of ROWS round numbers no generation used."""
        return next(counter) * ROWS

    paths: dict[str, Callable[[], Run]] = {
        "bare": bare,
        "serial": lambda: serial(engine, fresh(), tokens, Hooks()),
        "serial-steered": lambda: serial(engine, fresh(), tokens, steering()),
        "rows": lambda: rows(engine, fresh(), tokens, [Hooks()] * ROWS),
        "rows-same": lambda: rows(engine, fresh(), tokens, [steering()] * ROWS),
        "rows-distinct": lambda: rows(
            engine, fresh(), tokens, [steering(shift) for shift in range(ROWS)]
        ),
        "serial-reading": lambda: serial(engine, fresh(), tokens, reading()),
        "serial-probe": lambda: serial(engine, fresh(), tokens, probe()),
        "rows-probed": lambda: rows(engine, fresh(), tokens, [probe() for _ in range(ROWS)]),
    }
    try:
        return common.interleave(paths, rounds)
    finally:
        loop.close()
        engine.close()


def main(argv: list[str] | None = None) -> int:
    return server_bench_main(
        argv, __doc__, "bench-gguf-steering-", measure, lambda runs: table(runs, BASES)
    )


if __name__ == "__main__":
    sys.exit(main())
