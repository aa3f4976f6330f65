"""Continuous batching on the transformers engine: left-padded rows of one KV cache, each row
sampled and steered its own way (issue 17)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import pytest
import torch

from miserver.engines.base import (
    ChatPrompt,
    Hooks,
    Joiner,
    LoadOptions,
    SamplingParams,
    ScoreQuery,
    Token,
)
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.engines.transformers.batch import Row
from miserver.engines.transformers.engine import RowsBatch
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tests.conftest import cache_dir

pytestmark = pytest.mark.model

ROWS = 4
TOPICS = [
    "a dragon",
    "the moon and the long road home through the hills",
    "an old lighthouse keeper",
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def engine(gguf_path: object) -> Iterator[TransformersEngine]:
    """SmolLM2 on one torch thread, loaded with four rows."""
    options = LoadOptions(parallel=ROWS, threads=1)
    loaded = load_transformers_engine(
        gguf_path,  # type: ignore[arg-type]
        model_id="rows",
        cache_dir=cache_dir(),
        options=options,
    )
    yield loaded
    loaded.close()


@pytest.fixture
def batch(engine: TransformersEngine) -> RowsBatch:
    assert engine.batch is not None
    return engine.batch


def prompt(engine: TransformersEngine, topic: str) -> list[int]:
    chat = ({"role": "user", "content": f"Write a story about {topic}."},)
    return engine.render_chat(ChatPrompt(chat))


def alone(
    engine: TransformersEngine, ids: list[int], source: FixedSource | None = None
) -> list[int]:
    """The greedy tokens of `ids` on the serial path, under `source`'s steering."""
    made = engine.generate(ids, GREEDY, None, Hooks(steering=source))
    return [t.token_id for t in made if isinstance(t, Token)]


def batched(
    batch: RowsBatch,
    prompts: Sequence[list[int]],
    sources: Sequence[FixedSource | None],
    *,
    stagger: int = 2,
    between: object = None,
) -> list[list[int]]:
    """Each prompt's greedy tokens decoded as rows of `batch`, row i joining `stagger` steps
    after row i-1 (a row joining busy rows is prefilled at the steps, `chunk` tokens a step);
    a row leaves at its budget or an EOS. `between()` runs after each step."""
    rows: list = []
    made: list[list[int]] = []
    steps = 0
    while len(rows) < len(prompts) or any(r.open for r in rows):
        if len(rows) < len(prompts) and steps >= stagger * len(rows):
            i = len(rows)
            rows.append(batch.join(Joiner(prompts[i], GREEDY, None, Hooks(steering=sources[i]))))
            made.append([rows[-1].last.token_id] if rows[-1].ready else [])
        for i, row in enumerate(rows):
            if row.open and row.ready and (row.last.eos or len(made[i]) >= row.budget):
                batch.leave(row)
        live = [r for r in rows if r.open]
        if live:
            batch.step(live)
            for i, row in enumerate(rows):
                if row.open and row.ready:  # its next token, or the first its prefill gave
                    made[i].append(row.last.token_id)
        if callable(between):
            between()
        steps += 1
    return made


def steering(sae: SAE, feature: int, strength: float) -> FixedSource:
    return FixedSource(snapshot([applied_sae("inline", sae, sae.layer, {feature: strength})]))


def test_greedy_rows_joining_at_different_steps_give_their_text_alone(
    engine: TransformersEngine, batch: RowsBatch
) -> None:
    """OAI-CBM-01, OAI-CBM-14: prompts of different lengths, joining a batch that has already
    stepped (each side left-padded in turn), give the tokens each gives alone."""
    prompts = [prompt(engine, t) for t in TOPICS]
    assert len({len(p) for p in prompts}) == len(prompts)
    expected = [alone(engine, ids) for ids in prompts]
    assert batched(batch, prompts, [None] * len(prompts)) == expected


def test_each_row_is_steered_its_own_way(
    engine: TransformersEngine, batch: RowsBatch, trained_sae: SAE
) -> None:
    """OAI-CBM-15, OAI-HDR-09 (what each row ran): in one batch a row steered along one
    feature, a row steered along another and an unsteered row each give the tokens they give
    alone under their own steering, and the steering changes the text."""
    ids = prompt(engine, TOPICS[0])
    sources = [steering(trained_sae, 5, 150.0), None, steering(trained_sae, 9, -150.0)]
    expected = [alone(engine, ids, source) for source in sources]
    assert expected[0] != expected[1] and expected[2] != expected[1]
    assert batched(batch, [ids, ids, ids], sources, stagger=1) == expected


def test_scoring_between_steps_of_a_steered_batch_is_unsteered(
    engine: TransformersEngine, batch: RowsBatch, trained_sae: SAE
) -> None:
    """OAI-SCORE-35: a score taken between two steps of steered rows equals the score taken
    with no batch at all: no row's hook is on the model outside its own passes."""
    ids = prompt(engine, TOPICS[1])
    query = ScoreQuery(alternatives=5)
    idle = engine.score(ids, query)
    scores = []
    sources = [steering(trained_sae, 5, 150.0), steering(trained_sae, 9, -150.0)]
    batched(batch, [ids, ids], sources, between=lambda: scores.append(engine.score(ids, query)))
    assert scores and all(s == idle for s in scores)


def test_a_row_that_leaves_frees_its_place_and_keeps_its_prefix(
    engine: TransformersEngine, batch: RowsBatch
) -> None:
    """OAI-CBM-02, LOC-CHAT-43 per row: a full batch refuses a fifth row; once one leaves, a
    prompt that shares its ids reuses them and still gives its text alone."""
    ids = prompt(engine, TOPICS[2])
    rows = [batch.join(Joiner(ids, GREEDY, None)) for _ in range(ROWS)]
    with pytest.raises(RuntimeError, match="every row"):
        batch.join(Joiner(ids, GREEDY, None))
    batch.step(rows)
    batch.leave(rows[1])
    batch.step([rows[0], rows[2], rows[3]])
    for row in rows:
        batch.leave(row)
    assert batched(batch, [ids], [None]) == [alone(engine, ids)]
    again = batch.join(Joiner(ids, GREEDY, None))
    assert again.cached == len(ids) - 1
    batch.leave(again)


class _Failing:
    """A steering source whose vectors fail at the third pass."""

    def __init__(self, layer: int) -> None:
        self._layer = layer
        self._passes = 0

    def layers(self) -> frozenset[int]:
        return frozenset({self._layer})

    def vector(self, layer: int) -> torch.Tensor | None:
        self._passes += 1
        if self._passes >= 3:
            raise RuntimeError("the steering state is gone")
        return None

    def key(self) -> Hashable:
        return ("failing",)

    def mixed(self) -> bool:
        return False


def test_a_failed_step_closes_every_row_and_the_batch_starts_empty(
    engine: TransformersEngine, batch: RowsBatch
) -> None:
    """A pass that raised leaves some layers stepped and others not: every row is closed, and
    the next rows decode from an empty batch as they would alone."""
    ids = prompt(engine, TOPICS[0])
    plain, failing = batch.join_all(
        [Joiner(ids, GREEDY, None), Joiner(ids, GREEDY, None, Hooks(steering=_Failing(3)))]
    )
    assert isinstance(plain, Row) and isinstance(failing, Row) and failing.ready
    batch.step([plain, failing])
    with pytest.raises(RuntimeError, match="gone"):
        batch.step([plain, failing])
    assert not plain.open and not failing.open
    assert batched(batch, [ids], [None]) == [alone(engine, ids)]


def test_a_steered_prompt_joining_busy_rows_is_prefilled_a_chunk_a_step(
    engine: TransformersEngine, batch: RowsBatch, trained_sae: SAE
) -> None:
    """Issue 43 (chunked prefill): with `prefill-chunk` 8, a steered prompt that joins while
    a row decodes is prefilled on a cache of its own, at most 8 tokens a step after the
    decode, under its own steering at every chunk, and merged with its first token; each
    row gives the tokens it gives alone."""
    rows = batch._rows
    before, rows.chunk = rows.chunk, 8
    try:
        ids = prompt(engine, "a quiet market town and the clockmaker who kept its hours")
        source = steering(trained_sae, 5, 150.0)
        running = batch.join(Joiner(ids, GREEDY, None))
        assert running.ready
        joining = batch.join(Joiner(ids, GREEDY, None, Hooks(steering=source)))
        assert not joining.ready and joining.cached < len(ids) - 16
        made = [[running.last.token_id], []]
        fed = [len(joining.ids)]
        while not joining.ready:
            batch.step([running, joining])
            made[0].append(running.last.token_id)
            fed.append(len(joining.ids))
        assert len(fed) - 1 == -(-(len(ids) - joining.cached) // 8) and fed[-1] == len(ids)
        made[1].append(joining.last.token_id)
        pairs = list(zip((running, joining), made, strict=True))
        while running.open or joining.open:
            for row, tokens in pairs:
                if row.open and (row.last.eos or len(tokens) >= GREEDY.max_tokens):
                    batch.leave(row)
            live = [row for row, _ in pairs if row.open]
            if live:
                batch.step(live)
                for row, tokens in pairs:
                    if row.open:
                        tokens.append(row.last.token_id)
        assert made == [alone(engine, ids), alone(engine, ids, source)]
    finally:
        rows.chunk = before


def test_a_prefill_step_runs_a_joining_prompt_whole_and_decodes_no_row(
    engine: TransformersEngine, batch: RowsBatch
) -> None:
    """Issue 50: `step(decode=False)` feeds no ready row and prefills a joining prompt whole;
    both rows then give the tokens they give alone."""
    first, second = prompt(engine, TOPICS[0]), prompt(engine, TOPICS[1])
    running = batch.join(Joiner(first, GREEDY, None))
    made = [running.last.token_id]
    batch.step([running])
    made.append(running.last.token_id)
    joining = batch.join(Joiner(second, GREEDY, None))
    assert not joining.ready
    batch.step([running, joining], decode=False)
    assert joining.ready and running.last.token_id == made[-1]
    tokens = [[], [joining.last.token_id]]
    while running.open or joining.open:
        for row, got in zip((running, joining), tokens, strict=True):
            if row.open and (row.last.eos or len(got) + (row is running) * 2 >= row.budget):
                batch.leave(row)
        live = [r for r in (running, joining) if r.open]
        if not live:
            break
        batch.step(live)
        for row, got in zip((running, joining), tokens, strict=True):
            if row in live:
                got.append(row.last.token_id)
    assert [*made, *tokens[0]][:8] == alone(engine, first)[:8]
    assert tokens[1][:8] == alone(engine, second)[:8]
