"""KV prefix reuse in the transformers engine, on the real SmolLM2 (LOC-CHAT-43..48).

Every greedy output with reuse is compared, token for token, with a cold
engine's: a second engine over the same model whose kept cache is empty.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from miserver.engines.base import ChatPrompt, Prefilled, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine
from tests.conftest import TIMING
from tests.engines import ForwardLog, greedy, load_transformers

pytestmark = [pytest.mark.model, pytest.mark.xdist_group(TIMING)]

TOKENS = 12
ROME = [{"role": "user", "content": "Name three emperors of Rome."}]
BREAD = [{"role": "user", "content": "How do I bake a loaf of bread?"}]
FACT = "The Roman Republic grew from a small city state into a power that ruled the sea. "


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    """SmolLM2 on one torch thread, as in test_transformers_engine.py."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = load_transformers(cache_ram=0)  # the one kept cache alone: no prompt cache
    yield loaded
    loaded.close()
    torch.set_num_threads(threads)


def fresh(engine: TransformersEngine) -> TransformersEngine:
    """Another engine over the same model, with nothing cached."""
    return TransformersEngine(engine.model, engine.tokenizer, engine.facts, engine.eos_ids)


def chat(engine: TransformersEngine, messages: list[dict[str, Any]]) -> list[int]:
    return engine.render_chat(ChatPrompt(messages))


def run(
    engine: TransformersEngine,
    ids: Sequence[int],
    params: SamplingParams | None = None,
    seed: int | None = None,
) -> tuple[int, list[int]]:
    """The cached prompt tokens and the token ids of one generation (greedy by default)."""
    items = list(engine.generate(ids, params or greedy(TOKENS), engine.new_rng(seed)))
    assert isinstance(items[0], Prefilled)
    return items[0].cached_tokens, [t.token_id for t in items[1:] if isinstance(t, Token)]


def cold(engine: TransformersEngine, ids: Sequence[int]) -> list[int]:
    cached, out = run(fresh(engine), ids)
    assert cached == 0
    return out


def shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` have in common."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def kept(prompt: list[int], out: list[int]) -> list[int]:
    """What the cache holds after a generation: the last sampled token is never fed."""
    return [*prompt, *out[:-1]]


def reply(engine: TransformersEngine, out: list[int]) -> dict[str, Any]:
    return {"role": "assistant", "content": engine.decode(out)}


def test_one_more_message_prefills_only_that_message(engine: TransformersEngine) -> None:
    """LOC-CHAT-43, LOC-CHAT-44, LOC-CHAT-47: the next turn reuses the history it resends."""
    first = chat(engine, ROME)
    _, out = run(engine, first)
    second = chat(engine, [*ROME, reply(engine, out), {"role": "user", "content": "And two more?"}])
    cached, again = run(engine, second)
    assert cached == shared(kept(first, out), second)
    assert cached > len(first)
    assert again == cold(engine, second)


def test_an_edited_history_prefills_from_its_first_difference(engine: TransformersEngine) -> None:
    """LOC-CHAT-45, LOC-CHAT-47: an edit reuses up to the edit; a regenerate all but one token."""
    answer = {"role": "assistant", "content": "Augustus, Nero and Trajan."}
    follow = {"role": "user", "content": "Which one ruled longest?"}
    before = chat(engine, [*ROME, answer, follow])
    run(engine, before)
    edited = [{"role": "user", "content": "Name three emperors of Byzantium."}, answer, follow]
    after = chat(engine, edited)
    cached, out = run(engine, after)
    assert cached == shared(before, after)
    assert 0 < cached < len(after) - 10
    assert out == cold(engine, after)
    cached, again = run(engine, after)
    assert (cached, again) == (len(after) - 1, out)


def test_a_different_conversation_prefills_in_full(engine: TransformersEngine) -> None:
    """LOC-CHAT-46, LOC-CHAT-47: only the template's opening (the system prompt) is shared."""
    rome, bread = chat(engine, ROME), chat(engine, BREAD)
    run(engine, rome)
    cached, out = run(engine, bread)
    assert cached == shared(rome, bread)
    assert 0 < cached < len(bread) - 8
    assert out == cold(engine, bread)


def test_two_conversations_taking_turns_evict_each_other(engine: TransformersEngine) -> None:
    """LOC-CHAT-48: one cache; A, B, A reports only the A/B common prefix for the second A
    (with no prompt cache: `cache-ram` 0; with one, issue 43, the second A is restored,
    tests/integration/test_prompt_cache_transformers.py)."""
    rome, bread = chat(engine, ROME), chat(engine, BREAD)
    run(engine, rome)
    cached_bread, out_bread = run(engine, bread)
    cached_rome, out_rome = run(engine, rome)
    assert cached_bread == cached_rome == shared(rome, bread)
    assert out_bread == cold(engine, bread)
    assert out_rome == cold(engine, rome)


def test_a_closed_stream_leaves_a_usable_cache(engine: TransformersEngine) -> None:
    """LOC-CHAT-43, LOC-CHAT-47: a stream closed after 2 tokens keeps the prompt and 1 fed token."""
    prompt = chat(engine, ROME)
    stream = engine.generate(prompt, greedy(50), None)
    assert isinstance(next(stream), Prefilled)
    tokens = [next(stream), next(stream)]
    stream.close()
    follow = [*prompt, *(t.token_id for t in tokens if isinstance(t, Token))]
    cached, out = run(engine, follow)
    assert cached == len(prompt) + 1
    assert out == cold(engine, follow)


def test_seeded_requests_reuse_nothing(engine: TransformersEngine) -> None:
    """OAI-SEED-05, LOC-CHAT-47: a seeded request prefills in full, so reruns are identical."""
    prompt = chat(engine, ROME)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95)
    run(engine, prompt)
    first = run(engine, prompt, params, seed=7)
    second = run(engine, prompt, params, seed=7)
    assert first[0] == second[0] == 0
    assert engine.decode(first[1]).encode() == engine.decode(second[1]).encode()
    assert run(fresh(engine), prompt, params, seed=7) == first
    cached, _ = run(engine, prompt)
    assert cached == len(prompt) - 1  # the seeded run's cache was kept


def test_a_pass_that_raises_drops_the_cache(engine: TransformersEngine) -> None:
    """LOC-CHAT-43: a cache torn by an error mid-pass is never reused."""
    own, prompt = fresh(engine), chat(engine, ROME)
    run(own, prompt, greedy(2))

    def fail(*_args: Any) -> None:
        raise RuntimeError("layer failed")

    handle = engine.model.get_submodule("model.layers.3").register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="layer failed"):
            run(own, prompt)
    finally:
        handle.remove()
    cached, out = run(own, prompt)
    assert cached == 0
    assert out == cold(engine, prompt)


def test_close_drops_the_kept_cache(engine: TransformersEngine) -> None:
    """LOC-CHAT-48: the engine holds its one cache until it is closed."""
    own = fresh(engine)
    log = ForwardLog(engine.model)
    try:
        run(own, chat(engine, ROME), greedy(2))
    finally:
        log.remove()
    gc.collect()
    assert all(ref() is not None for ref in log.caches)
    own.close()
    gc.collect()
    assert all(ref() is None for ref in log.caches)


def test_a_second_turn_over_a_long_history_starts_fast(engine: TransformersEngine) -> None:
    """LOC-CHAT-44: a 2nd turn over a ~1k-token history is prefilled in under half the time."""
    history: list[dict[str, Any]] = []
    for i in range(5):
        history.append({"role": "user", "content": f"Tell me fact {i} about Rome. " + FACT * 5})
        history.append({"role": "assistant", "content": FACT * 5})
    history.append({"role": "user", "content": "Summarise all of that."})
    first = chat(engine, history)
    assert 800 < len(first) < 1400
    cold_s, cold_prefilled = time_to_prefilled(engine, first)
    assert cold_prefilled.cached_tokens < 40
    second = chat(engine, [*history, reply(engine, []), {"role": "user", "content": "Shorter."}])
    warm_s, warm_prefilled = time_to_prefilled(engine, second)
    assert warm_prefilled.cached_tokens == len(first)
    assert warm_s < 0.5 * cold_s


def time_to_prefilled(engine: TransformersEngine, ids: list[int]) -> tuple[float, Prefilled]:
    """Seconds until the stream's Prefilled item; the stream is then closed."""
    started = time.perf_counter()
    stream = engine.generate(ids, greedy(1), None)
    first = next(stream)
    seconds = time.perf_counter() - started
    stream.close()
    assert isinstance(first, Prefilled)
    return seconds, first
