"""A thinking budget on both engines, alone and as a row of a batch (engines/thinking.py),
on the real SmolLM2 GGUF: the span's close is forced once the budget is spent, and the
tokens before it are the ones the reply picks without a budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from miserver.engines.base import ChatPrompt, Engine, Joiner, LoadOptions, ThinkingBudget, Token
from miserver.engines.llamacpp import load_llamacpp_engine
from miserver.engines.transformers import load_transformers_engine
from tests.engines import greedy, home_cache_dir, smollm2_gguf
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

SPENT = 4  # the budget
STEPS = 12
OPTIONS = LoadOptions(threads=1, ctx_size=1024, parallel=3, cache_ram=0)


@pytest.fixture(scope="module", params=["llama.cpp", "transformers"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param == "llama.cpp":
        loaded: Engine = load_llamacpp_engine(
            smollm2_gguf(), model_id="smollm2:Q4_1", options=OPTIONS
        )
    else:
        loaded = load_transformers_engine(
            smollm2_gguf(), model_id="smollm2:Q4_1", cache_dir=home_cache_dir(), options=OPTIONS
        )
    yield loaded
    loaded.close()


def story(engine: Engine) -> list[int]:
    ask = {"role": "user", "content": "Write a long story about a red kite."}
    return engine.render_chat(ChatPrompt([ask]))


def spec(engine: Engine, tokens: int = SPENT) -> ThinkingBudget:
    close = tuple(engine.tokenize("</think>", add_special_tokens=False))
    return ThinkingBudget(tokens, "<think>", "</think>", close, inside=True)


def alone(engine: Engine, budget: ThinkingBudget | None) -> list[int]:
    params = replace(greedy(STEPS), thinking=budget)
    return [
        t.token_id for t in engine.generate(story(engine), params, None) if isinstance(t, Token)
    ]


def test_the_close_is_forced_when_the_budget_is_spent(engine: Engine) -> None:
    """Issue 45 item 1 (`thinking.budget_tokens`): SPENT tokens as the reply picks them, then
    the close, token by token; the reply goes on after it."""
    free = alone(engine, None)
    budget = spec(engine)
    ids = alone(engine, budget)
    close = list(budget.close_ids)
    assert ids[:SPENT] == free[:SPENT]
    assert ids[SPENT : SPENT + len(close)] == close
    assert len(ids) == STEPS and "</think>" not in engine.decode(free)


def test_each_row_of_a_batch_keeps_its_own_budget(engine: Engine) -> None:
    """As rows: one with the budget, one with a larger one, one with none; each as alone."""
    batch = engine.batch
    assert batch is not None
    budgets = [spec(engine), spec(engine, 7), None]
    rows = [
        batch.join(Joiner(story(engine), replace(greedy(STEPS), thinking=b), None)) for b in budgets
    ]
    got = [[t.token_id for t in tokens] for tokens in stepped(batch, rows)]
    free = alone(engine, None)
    for b, ids in zip(budgets, got, strict=True):
        if b is None:
            assert ids == free
        else:
            assert ids[: b.tokens] == free[: b.tokens]
            assert ids[b.tokens : b.tokens + len(b.close_ids)] == list(b.close_ids)
