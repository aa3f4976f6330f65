"""The prompt cache on the llama.cpp engine (issue 43), on the real SmolLM2 GGUF: a prompt
whose KV another prompt pushed out is restored from host memory instead of prefilled, on
the serial context and on a row of the batch, and answers as it would have.

"The same as a cold prefill": the same greedy tokens, and log-probabilities within
`COLD_TOLERANCE` of a cold prefill's. llama.cpp computes a prompt run in one batch and a
prompt whose prefix was kept (restored, or still held by the context) in different batch
shapes, and the Q4_1 model's numbers move with them by up to about 0.2 nats here; past a
near tie that noise can flip a greedy token, as with any kept prefix (the batch's row did
at its 23rd token), so the answers compared are 16 tokens long (docs/DECISIONS.md,
"Contract 0.18.0"). A restored prefix is exact against the same prefix held in the
context: the bytes are the ones that were saved.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from miserver.engines.base import Joiner, LoadOptions, SamplingParams
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from tests.engines import smollm2_gguf
from tests.prompt_cache import answer, cold_then_restored, prompt, push
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

COLD_TOLERANCE = 0.3  # nats: the engine's batch-shape noise on Q4_1, measured up to ~0.19
MIB = 1 << 20


def load(parallel: int, cache_ram: int = -1) -> LlamaCppEngine:
    options = LoadOptions(ctx_size=4096, parallel=parallel, cache_ram=cache_ram)
    return load_llamacpp_engine(smollm2_gguf(), model_id="smollm2", options=options)


@pytest.fixture(scope="module")
def serial() -> Iterator[LlamaCppEngine]:
    engine = load(1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def rows() -> Iterator[LlamaCppEngine]:
    engine = load(2)
    yield engine
    engine.close()


@pytest.mark.parametrize("kind", ["serial", "rows"])
def test_a_restored_prompt_answers_as_a_cold_prefill(
    kind: str, serial: LlamaCppEngine, rows: LlamaCppEngine
) -> None:
    """Issue 43: prompt A runs cold; other prompts push its KV out of every sequence (saved
    to the prompt cache as they do); A again restores all but its last token from host
    memory (`cached_tokens`, the cache's hit), with the same greedy tokens as cold and
    log-probabilities within the engine's batch-shape noise of cold."""
    engine = serial if kind == "serial" else rows
    first, again = cold_then_restored(engine, prompt(engine, f"Tell me about Rome ({kind})."))
    assert again.tokens == first.tokens
    assert again.close_to(first, COLD_TOLERANCE), (first.logprobs, again.logprobs)


def test_a_restored_prefix_is_exactly_the_prefix_held() -> None:
    """Issue 43: A's KV restored from the cache gives the very log-probabilities A's KV gives
    when the context still holds it (the saved bytes come back): one engine runs A twice in
    a row (held), another runs A, then B, then A (restored)."""
    held_engine, restored_engine = load(1, cache_ram=0), load(1)
    try:
        a = prompt(held_engine, "Tell me about Carthage.")
        answer(held_engine, a)
        held = answer(held_engine, a)
        answer(restored_engine, a)
        push(restored_engine, 7)
        restored = answer(restored_engine, a)
    finally:
        held_engine.close()
        restored_engine.close()
    assert held.cached == restored.cached == len(a) - 1
    assert restored.tokens == held.tokens
    assert restored.logprobs == held.logprobs


def test_a_small_budget_evicts_the_least_recently_used() -> None:
    """Issue 43: with room for about one prompt's state (`cache-ram` 4 MiB; each state is
    about 3 MB here), saving a third prompt evicts the first; the second, kept, is restored
    and the first is prefilled again."""
    engine = load(1, cache_ram=4)
    try:
        cache = engine.prompt_cache
        assert cache is not None and cache.budget == 4 * MIB
        a, b, c = (prompt(engine, q) for q in ("About Rome.", "About Athens.", "About Sparta."))
        answer(engine, a)
        answer(engine, b)  # A saved
        answer(engine, c)  # B saved; A evicted
        assert cache.counts.evicted >= 1 and cache.held_bytes <= cache.budget
        assert answer(engine, b).cached == len(b) - 1  # restored (C saved, B evicted now)
        assert answer(engine, a).cached < len(a) - 1  # gone: only the shared head is kept
    finally:
        engine.close()


def test_rows_joining_together_never_save_or_restore_a_copy_in_flight() -> None:
    """Issue 43: llama.cpp copies a sequence's cells at once but its keys and values at the
    next decode, so prompts joining together, some borrowing another sequence's KV, must not
    save a copy's target (its old KV under its new ids) nor restore into a sequence a copy
    still reads or writes. Six prompts alone, then 60 groups of one to four joining together
    (a seeded shuffle): every row's greedy tokens are the ones it gets alone. Without the
    guard (`Rows._copying`) five rows of this run got another prompt's KV."""
    engine = load(4)
    batch = engine.batch
    assert batch is not None
    topics = ["a dragon", "the moon", "a lighthouse", "a garden", "a river", "a clock"]
    ids = {t: prompt(engine, f"Write a long story about {t}.", system="") for t in topics}

    def together(group: list[str], tokens: int) -> dict[str, list[int]]:
        params = SamplingParams(max_tokens=tokens, temperature=0)
        rows = batch.join_all([Joiner(ids[t], params, None) for t in group])
        made = stepped(batch, rows)
        return {t: [x.token_id for x in m] for t, m in zip(group, made, strict=True)}

    try:
        alone = {t: together([t], 6)[t] for t in topics}
        shuffle = random.Random(0)
        for _ in range(60):
            group = shuffle.sample(topics, shuffle.randint(1, 4))
            tokens = shuffle.choice([2, 6])
            assert together(group, tokens) == {t: alone[t][:tokens] for t in group}, group
    finally:
        engine.close()
