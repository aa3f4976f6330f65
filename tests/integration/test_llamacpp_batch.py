"""Rows decoded together on llama.cpp (continuous batching), on the real SmolLM2 GGUF.

Each row must behave as it does alone: the same greedy tokens, its own
budget, penalties and grammar, its KV freed for a later row. "Alone" is the
row decoded by itself on the same batch context: against the serial context
the logits may differ in their last bits where a prefix was reused (as two
serial runs may, context.py), which can flip a near tie (docs/DECISIONS.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from miserver.engines.base import (
    BatchRow,
    ChatPrompt,
    Constraint,
    Joiner,
    LoadOptions,
    SamplingParams,
)
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from miserver.serving.completions.batching import Batcher
from miserver.serving.completions.generation import ChoiceJob, TextDelta
from tests.engines import greedy, run, smollm2_gguf
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

TOPICS = ["a cat", "the sea", "a red kite", "winter", "bread", "a robot"]


def prompt(engine: LlamaCppEngine, topic: str) -> list[int]:
    """A chat asking for a long answer: greedy decoding runs well past 20 tokens."""
    ask = {"role": "user", "content": f"Write a long story about {topic}."}
    return engine.render_chat(ChatPrompt([ask]))


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    options = LoadOptions(threads=1, ctx_size=1024, parallel=4)
    loaded = load_llamacpp_engine(smollm2_gguf(), model_id="smollm2:Q4_1", options=options)
    yield loaded
    loaded.close()


def drive(
    engine: LlamaCppEngine,
    asks: Sequence[tuple[list[int], SamplingParams]],
    together: bool = False,
) -> list[Any]:
    """Join every ask (one by one, or `together` through `join_all`), step until each row
    ends (EOS or its budget), leave it; the ids."""
    batch = engine.batch
    assert batch is not None
    rows: list[BatchRow]
    if together:
        joined = batch.join_all([Joiner(ids, params, None) for ids, params in asks])
        rows = [row for row in joined if not isinstance(row, Exception)]
        assert len(rows) == len(asks), joined
    else:
        rows = [batch.join(Joiner(ids, params, None)) for ids, params in asks]
    return [[token.token_id for token in tokens] for tokens in stepped(batch, rows)]


def test_greedy_rows_give_the_tokens_each_gives_alone(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02: four greedy rows in one batch give, each, the tokens that prompt gives
    alone; and the first of them, the serial path's."""
    asks = [(prompt(engine, t), greedy(24)) for t in TOPICS[:4]]
    together = drive(engine, asks)
    assert together == [drive(engine, [ask])[0] for ask in asks]
    assert together[0] == run(engine, *asks[0])[1]


def test_each_row_keeps_its_own_budget_and_penalty(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02: rows with different max_tokens and penalties share one batch; each ends at
    its own budget and gives the tokens it gives alone."""
    asks = [
        (prompt(engine, "a cat"), greedy(3)),
        (prompt(engine, "the sea"), greedy(40, frequency_penalty=2.0, presence_penalty=2.0)),
        (prompt(engine, "bread"), greedy(11, presence_penalty=1.0)),
    ]
    together = drive(engine, asks)
    assert [len(t) for t in together] == [3, 40, 11]
    assert together == [drive(engine, [ask])[0] for ask in asks]
    assert together[1] != drive(engine, [(asks[1][0], greedy(40))])[0]  # the penalty bit


def test_a_row_under_a_grammar_beside_a_free_one(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02: a row held to a JSON schema writes a valid document while the row beside
    it writes free text."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constrained = SamplingParams(
        max_tokens=40, temperature=0.0, constraint=Constraint(json.dumps(schema))
    )
    asks = [(prompt(engine, "winter"), greedy(30)), (prompt(engine, "a robot"), constrained)]
    free, document = drive(engine, asks)
    assert json.loads(engine.decode(document))["ok"] in (True, False)
    assert free == drive(engine, asks[:1])[0]


def test_a_returning_prompt_reuses_its_rows_prefix(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02: a row that left keeps its KV; a later prompt that extends it lands on that
    row and runs only what is new; a full batch refuses one row more."""
    batch = engine.batch
    assert batch is not None
    first = prompt(engine, "a red kite")
    drive(engine, [(first, greedy(4))])
    longer = [*first, *engine.tokenize(" And another.", add_special_tokens=False)]
    row = batch.join(Joiner(longer, greedy(2), None))
    try:
        assert row.cached >= len(first) - 1
    finally:
        batch.leave(row)
    rows = [batch.join(Joiner(prompt(engine, t), greedy(2), None)) for t in TOPICS[:4]]
    try:
        with pytest.raises(RuntimeError, match="every row"):
            batch.join(Joiner(prompt(engine, "bread"), greedy(2), None))
    finally:
        for r in rows:
            batch.leave(r)


def test_busy_rows_stay_one_block_and_a_moved_row_decodes_on(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02, OAI-CBM-14 (throughput): llama.cpp splits a step into one forward pass per
    run of consecutive sequences (batch.py), so the busy sequences stay one block: a hole a
    row leaves inside it is filled, by the next step, with the block's last row, KV and
    all, and every row, moved or not, still gives the tokens it gives alone."""
    batch = engine.batch
    assert batch is not None
    asks = [(prompt(engine, t), greedy(12)) for t in TOPICS[:4]]
    alone = [drive(engine, [ask])[0] for ask in asks]
    rows = batch.join_all([Joiner(ids, params, None) for ids, params in asks])
    assert all(not isinstance(row, Exception) for row in rows)
    out = [[row.last.token_id] for row in rows]  # type: ignore[union-attr]
    for _ in range(3):
        batch.step(rows)
        for made, row in zip(out, rows, strict=True):
            made.append(row.last.token_id)
    batch.leave(rows[1])
    live = [rows[0], rows[2], rows[3]]
    while len(out[0]) < 12:
        batch.step(live)
        seqs = sorted(row.seq for row in live)  # type: ignore[attr-defined]
        assert seqs == list(range(seqs[0], seqs[0] + len(live)))
        for i in (0, 2, 3):
            out[i].append(rows[i].last.token_id)
    for row in live:
        batch.leave(row)
    assert [out[i] for i in (0, 2, 3)] == [alone[i] for i in (0, 2, 3)]
    assert out[1] == alone[1][:4]


def test_prompts_joining_together_prefill_together_and_keep_their_prefixes(
    engine: LlamaCppEngine,
) -> None:
    """OAI-CBM-02, OAI-CBM-14 (throughput): prompts that arrive together join through
    `join_all`, what is new of each prefilled in shared batches (batch.py), and each row
    gives the tokens it gives joined alone; when the same prompts come back together, in
    another order, each lands on the sequence that kept its prefix (it takes the ends of
    the busy block in turn, copying no KV) and runs only its last token."""
    batch = engine.batch
    assert batch is not None
    asks = [(prompt(engine, t), greedy(16)) for t in TOPICS[:4]]
    alone = [drive(engine, [ask])[0] for ask in asks]
    assert drive(engine, asks, together=True) == alone
    back = list(reversed(asks))
    joined = batch.join_all([Joiner(ids, params, None) for ids, params in back])
    try:
        assert [row.cached for row in joined] == [len(ids) - 1 for ids, _ in back]  # type: ignore[union-attr]
        seqs = sorted(row.seq for row in joined)  # type: ignore[union-attr]
        assert seqs == list(range(seqs[0], seqs[0] + len(back)))
    finally:
        for row in joined:
            batch.leave(row)  # type: ignore[arg-type]


def test_a_refused_joiner_fails_alone(engine: LlamaCppEngine) -> None:
    """OAI-CBM-02: among prompts joining together, one holding an id outside the vocabulary
    gets its own error, and the others their rows, which decode as they do alone."""
    batch = engine.batch
    assert batch is not None
    good = (prompt(engine, "bread"), greedy(8))
    joined = batch.join_all(
        [Joiner([1, engine.facts.vocab_size + 5], greedy(8), None), Joiner(*good, None)]
    )
    assert isinstance(joined[0], ValueError)
    row = joined[1]
    assert not isinstance(row, Exception)
    out = [row.last.token_id]
    while len(out) < 8 and not row.last.eos:
        batch.step([row])
        out.append(row.last.token_id)
    batch.leave(row)
    assert out == drive(engine, [good])[0]


def notes(engine: LlamaCppEngine, topic: str) -> list[int]:
    """A chat of about 100 tokens, most of them after the template's shared head."""
    facts = " ".join(f"Fact {j} about {topic} is worth a line." for j in range(8))
    ask = {"role": "user", "content": f"{facts} Write a long story about {topic}."}
    return engine.render_chat(ChatPrompt([ask]))


@pytest.fixture(scope="module")
def chunked() -> Iterator[LlamaCppEngine]:
    """Rows that prefill a prompt joining busy rows 8 tokens a step."""
    options = LoadOptions(threads=1, ctx_size=1024, parallel=4, prefill_chunk=8)
    loaded = load_llamacpp_engine(smollm2_gguf(), model_id="smollm2:Q4_1", options=options)
    yield loaded
    loaded.close()


def test_a_prompt_joining_busy_rows_is_prefilled_a_chunk_a_step(
    chunked: LlamaCppEngine,
) -> None:
    """Issue 43 (chunked prefill): a prompt that joins while a row decodes is not prefilled
    at the join; each step gives the decoding row its next token, then runs `prefill-chunk`
    (8) of the newcomer's prompt tokens, until its last one gives its first token. Both
    rows give the tokens they give alone."""
    batch = chunked.batch
    assert batch is not None
    first, second = (prompt(chunked, "a cat"), greedy(24)), (notes(chunked, "winter"), greedy(8))
    [running] = batch.join_all([Joiner(*first, None)])
    assert running.ready
    made = [running.last.token_id]
    batch.step([running])
    made.append(running.last.token_id)
    [joining] = batch.join_all([Joiner(*second, None)])
    assert not joining.ready and joining.cached < len(second[0]) - 8
    ran = [len(joining.held)]  # type: ignore[attr-defined]
    while not joining.ready:
        batch.step([running, joining])
        made.append(running.last.token_id)  # the decoding row went on
        ran.append(len(joining.held))  # type: ignore[attr-defined]
    steps = len(ran) - 1
    assert steps == -(-(len(second[0]) - joining.cached) // 8) >= 3
    assert all(0 < b - a <= 8 for a, b in itertools.pairwise(ran))
    assert ran[-1] == len(second[0])
    rest = stepped(batch, [running, joining])
    alone = [drive(chunked, [ask])[0] for ask in (first, second)]  # each prefix cached now
    assert [*made, *[t.token_id for t in rest[0][1:]]][: len(alone[0])] == alone[0]
    assert [t.token_id for t in rest[1]] == alone[1]


def test_a_whole_prompt_chunk_prefills_at_the_first_step(chunked: LlamaCppEngine) -> None:
    """Issue 43: `prefill-chunk` 0 runs a joining prompt whole at the next step, after the
    decoding rows' tokens."""
    batch = chunked.batch
    assert batch is not None
    rows = batch._rows  # type: ignore[attr-defined]
    rows.chunk = 0
    try:
        [running] = batch.join_all([Joiner(prompt(chunked, "bread"), greedy(4), None)])
        [joining] = batch.join_all([Joiner(prompt(chunked, "a robot"), greedy(4), None)])
        assert not joining.ready
        batch.step([running, joining])
        assert joining.ready and joining.last.token_id >= 0
        batch.leave(running)
        batch.leave(joining)
    finally:
        rows.chunk = 8


def test_a_row_that_leaves_while_prefilling_keeps_what_ran(chunked: LlamaCppEngine) -> None:
    """Issue 43: a row whose client leaves before its prompt is prefilled frees its
    sequence holding the chunks that ran; the same prompt, joining again, finds them
    cached and gives the tokens it gives alone."""
    batch = chunked.batch
    assert batch is not None
    ask = (notes(chunked, "a red kite"), greedy(6))
    [running] = batch.join_all([Joiner(prompt(chunked, "the sea"), greedy(12), None)])
    [joining] = batch.join_all([Joiner(*ask, None)])
    start = joining.cached
    for _ in range(4):
        batch.step([running, joining])
    assert not joining.ready and len(joining.held) == start + 32  # type: ignore[attr-defined]
    batch.leave(joining)
    batch.leave(running)
    [again] = batch.join_all([Joiner(*ask, None)])
    assert again.cached == start + 32  # more than the chat template's head any other holds
    made = [t.token_id for t in stepped(batch, [again])[0]]
    batch_alone = drive(chunked, [ask])[0]
    assert made == batch_alone


def test_a_prefill_step_runs_a_joining_prompt_whole_and_decodes_no_row(
    chunked: LlamaCppEngine,
) -> None:
    """Issue 50 (an interactive request's prompt while only Batch API rows decode):
    `step(decode=False)` feeds no ready row (its tokens stay as they were) and prefills a
    joining prompt whole, chunk or not; the rows then decode on, each giving the tokens it
    gives alone."""
    batch = chunked.batch
    assert batch is not None
    first, second = (prompt(chunked, "a cat"), greedy(12)), (notes(chunked, "a harbour"), greedy(6))
    [running] = batch.join_all([Joiner(*first, None)])
    made = [running.last.token_id]
    [joining] = batch.join_all([Joiner(*second, None)])
    assert not joining.ready and len(second[0]) - joining.cached > 8
    held = len(running.held)  # type: ignore[attr-defined]
    batch.step([running, joining], decode=False)
    assert joining.ready and running.last.token_id == made[-1]
    assert len(running.held) == held  # type: ignore[attr-defined]
    rest = stepped(batch, [running, joining])
    alone = [drive(chunked, [ask])[0] for ask in (first, second)]
    assert [*made, *[t.token_id for t in rest[0][1:]]][: len(alone[0])] == alone[0]
    assert [t.token_id for t in rest[1]] == alone[1]
    batch.leave(running)
    batch.leave(joining)


def test_a_capped_step_prefills_at_most_the_cap(chunked: LlamaCppEngine) -> None:
    """Issue 50: `step(cap=4)` beside a decoding row runs at most 4 of a joining prompt's
    tokens (the load's chunk is 8), so the steps a Batch API prompt's prefill takes stay
    short; the prompt still gives the tokens it gives alone."""
    batch = chunked.batch
    assert batch is not None
    first, second = (prompt(chunked, "a fox"), greedy(40)), (notes(chunked, "a mill"), greedy(4))
    [running] = batch.join_all([Joiner(*first, None)])
    [joining] = batch.join_all([Joiner(*second, None)])
    ran = [len(joining.held)]  # type: ignore[attr-defined]
    while not joining.ready:
        batch.step([running, joining], cap=4)
        ran.append(len(joining.held))  # type: ignore[attr-defined]
    assert all(0 < b - a <= 4 for a, b in itertools.pairwise(ran)) and len(ran) > 3
    batch.leave(running)
    batch.leave(joining)


class _CountingExecutor(ThreadPoolExecutor):
    """One worker thread, as an engine's executor; counts the jobs it was given."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.jobs = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


def test_a_paced_stream_steps_in_bursts_with_its_text_in_order(engine: LlamaCppEngine) -> None:
    """Issue 43 (batching.py `Batcher._post`): a streamed row's text pieces within its pace
    wait in its inbox and the steps go on in the same job, so a paced stream wakes the
    event loop about once a pace (BURST_S at most a job), not once a token; its text is the
    same, in order, as a stream with no pace, which wakes the loop at every step."""
    ids = prompt(engine, "bread")
    batch = engine.batch
    assert batch is not None

    async def streamed(pace: float) -> tuple[str, int]:
        with _CountingExecutor() as executor:
            batcher = Batcher(engine, batch, executor)
            params = SamplingParams(max_tokens=24, temperature=0.0)
            job = ChoiceJob(prompt_ids=ids, params=params, stop_strings=(), rng=None)
            text = ""
            async for event in batcher.events(job, pace):
                if isinstance(event, TextDelta):
                    text += event.text
                else:
                    assert event.finish_reason == "length"
            return text, executor.jobs

    every, every_jobs = asyncio.run(streamed(0.0))
    paced, paced_jobs = asyncio.run(streamed(10.0))
    assert paced == every
    assert every_jobs >= 24  # an admission, then a job a step
    assert paced_jobs <= 12  # an admission, then a job a BURST_S
