"""The prompt cache on the transformers engine (issue 43), on the real SmolLM2 in float32:
a prompt whose keys and values another prompt pushed out is restored from a stored copy,
on the serial path and on a row of the batch, and answers as a cold prefill does; a
steered prompt's keys and values never serve an unsteered one, nor the other way.

float32 on the CPU: a prefix run in its own forward pass and the same positions run in one
pass with the rest differ in the last bits (a few 1e-6 of a log-probability), so the
greedy tokens are the same and the log-probabilities agree within `COLD_TOLERANCE`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from miserver.engines.base import Joiner, LoadOptions, SamplingParams
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tests.conftest import cache_dir
from tests.prompt_cache import TOKENS, answer, cold_then_restored, other, prompt, push
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

COLD_TOLERANCE = 1e-4


def load(parallel: int, cache_ram: int = -1) -> TransformersEngine:
    options = LoadOptions(threads=1, parallel=parallel, cache_ram=cache_ram)
    return load_transformers_engine(
        embedded_default(), model_id="smollm2", cache_dir=cache_dir(), options=options
    )


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, TransformersEngine]]:
    threads = torch.get_num_threads()
    loaded = {"serial": load(1), "rows": load(2)}
    yield loaded
    for engine in loaded.values():
        engine.close()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["serial", "rows"])
def test_a_restored_prompt_answers_as_a_cold_prefill(
    kind: str, engines: dict[str, TransformersEngine]
) -> None:
    """Issue 43: prompt A runs cold; other prompts push its keys and values out (stored as
    they go); A again starts from a copy of the stored prefix, all but its last token
    (`cached_tokens`, a hit), and answers as cold did: the same greedy tokens, the same
    log-probabilities within float32 rounding."""
    engine = engines[kind]
    first, again = cold_then_restored(engine, prompt(engine, f"Tell me about Rome ({kind})."))
    assert again.tokens == first.tokens
    assert len(again.logprobs) == TOKENS and again.close_to(first, COLD_TOLERANCE)


def test_rows_joining_together_share_one_stored_prefix(
    engines: dict[str, TransformersEngine],
) -> None:
    """Issue 43: a stored prefix is copied, not taken out, so two prompts that join the
    batch together, each with the same system prompt, both start from it."""
    engine = engines["rows"]
    batch = engine.batch
    assert batch is not None
    answer(engine, prompt(engine, "Warm the cache."))
    answer(engine, other(engine, 11))  # the row's own kept prefix is the store's now
    params = SamplingParams(max_tokens=2, temperature=0)
    ids = [prompt(engine, q) for q in ("About Athens.", "About Sparta.")]
    rows = batch.join_all([Joiner(i, params, None) for i in ids])
    stepped(batch, rows)
    shared = len(prompt(engine, "")) - 8  # at least the system prompt, less the question's
    assert all(row.cached >= shared for row in rows), [row.cached for row in rows]


def test_a_small_budget_evicts_the_least_recently_used() -> None:
    """Issue 43: with room for one prompt's keys and values (`cache-ram` 8 MiB; about 5.5 MB
    each here, float32), a third prompt's evicts the first's."""
    engine = load(1, cache_ram=8)
    try:
        cache = engine.prompt_cache
        assert cache is not None
        a, b, c = (prompt(engine, q) for q in ("About Rome.", "About Athens.", "About Sparta."))
        answer(engine, a)
        answer(engine, b)  # A stored
        answer(engine, c)  # B stored; A evicted
        assert cache.counts.evicted >= 1 and cache.held_bytes <= cache.budget
        assert answer(engine, b).cached == len(b) - 1
        assert answer(engine, a).cached < len(a) - 1
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["serial", "rows"])
def test_steered_and_unsteered_prefixes_never_mix(
    kind: str, engines: dict[str, TransformersEngine], trained_sae: SAE
) -> None:
    """Issue 43: a prompt's keys and values made under steering are stored under that
    steering state: the same prompt unsteered finds nothing of them (it prefills, and
    answers as unsteered), and each state later restores its own."""
    engine = engines[kind]
    steered = FixedSource(
        snapshot([applied_sae("inline", trained_sae, trained_sae.layer, {3: 8.0})])
    )
    system = f"You write short travel notes for sailors ({kind}). " * 6  # no other test's
    a = prompt(engine, "Describe a harbour at dawn.", system)
    with_steering = answer(engine, a, steered)
    for k in range(3):
        push(engine, 20 + k)
    plain = answer(engine, a)
    assert plain.cached < 40  # the steered keys and values were not used
    for k in range(3):
        push(engine, 30 + k)
    again = answer(engine, a, steered)
    assert again.cached == len(a) - 1 and again.tokens == with_steering.tokens
    assert answer(engine, a).cached == len(a) - 1  # its own, unsteered
