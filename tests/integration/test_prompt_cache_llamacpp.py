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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from miserver.engines.base import ChatPrompt, Joiner, LoadOptions, Prefilled, SamplingParams
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from tests.engines import smollm2_gguf, stepped

pytestmark = pytest.mark.model

TOKENS = 16
COLD_TOLERANCE = 0.3  # nats: the engine's batch-shape noise on Q4_1, measured up to ~0.19
MIB = 1 << 20
SYSTEM = "You are a careful assistant who answers in detail and names your sources. " * 6


@dataclass(frozen=True)
class Answer:
    cached: int
    tokens: list[int]
    logprobs: list[float]


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


def prompt(engine: LlamaCppEngine, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return engine.render_chat(ChatPrompt(tuple(messages)))


def other(engine: LlamaCppEngine, k: int) -> list[int]:
    """A prompt sharing only the template's head with `prompt`'s."""
    content = f"Question {k}: what is {k} times {k + 3}? Show the working, step by step."
    return engine.render_chat(ChatPrompt(({"role": "user", "content": content},)))


def params() -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, temperature=0, logprobs=2)


def answer(engine: LlamaCppEngine, ids: Sequence[int]) -> Answer:
    """A greedy generation on the serial context, or on a row when the engine batches."""
    batch = engine.batch
    if batch is None:
        items = list(engine.generate(ids, params(), None))
        assert isinstance(items[0], Prefilled)
        cached, tokens = items[0].cached_tokens, items[1:]
    else:
        [row] = batch.join_all([Joiner(ids, params(), None)])
        cached, tokens = row.cached, stepped(batch, [row])[0]
    out = [t for t in tokens if not isinstance(t, Prefilled)]
    return Answer(cached, [t.token_id for t in out], [t.logprobs.logprob for t in out])  # type: ignore[union-attr]


def close_to(a: Answer, b: Answer, tolerance: float) -> bool:
    return len(a.logprobs) == len(b.logprobs) and all(
        abs(x - y) <= tolerance for x, y in zip(a.logprobs, b.logprobs, strict=True)
    )


@pytest.mark.parametrize("kind", ["serial", "rows"])
def test_a_restored_prompt_answers_as_a_cold_prefill(
    kind: str, serial: LlamaCppEngine, rows: LlamaCppEngine
) -> None:
    """Issue 43: prompt A runs cold; other prompts push its KV out of every sequence (saved
    to the prompt cache as they do); A again restores all but its last token from host
    memory (`cached_tokens`, the cache's hit), with the same greedy tokens as cold and
    log-probabilities within the engine's batch-shape noise of cold."""
    engine = serial if kind == "serial" else rows
    cache = engine.prompt_cache
    assert cache is not None
    a = prompt(engine, f"Tell me about Rome ({kind}).")
    first = answer(engine, a)
    assert first.cached < 40  # cold: at most the template's head was held
    for k in range(3):  # more prompts than the batch has sequences
        answer(engine, other(engine, k))
    hits = cache.counts.hits
    again = answer(engine, a)
    assert again.cached == len(a) - 1
    assert cache.counts.hits == hits + 1
    assert again.tokens == first.tokens
    assert close_to(again, first, COLD_TOLERANCE), (first.logprobs, again.logprobs)


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
        answer(restored_engine, other(restored_engine, 7))
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
