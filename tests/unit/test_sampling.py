"""The pure sampling functions of the transformers engine."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from miserver.engines.transformers.sampling import (
    apply_penalties,
    is_no_op_penalty,
    new_rng,
    nucleus,
    penalty_factors,
    pick,
)

PENALTY = st.floats(min_value=-2.0, max_value=2.0, allow_nan=False)
COUNT = st.integers(min_value=1, max_value=8192)
LOGITS = st.lists(
    st.floats(min_value=-30.0, max_value=30.0, allow_nan=False, width=32), min_size=1, max_size=64
).map(lambda values: torch.tensor(values, dtype=torch.float32))


def test_no_seed_means_the_global_rng() -> None:
    """OAI-SEED-08: without a seed no generator is made (the server picks none)."""
    assert new_rng(None) is None


def test_same_seed_gives_the_same_draws() -> None:
    """OAI-SEED-05, OAI-CHAT-13: a seeded generator repeats its draws exactly."""
    logits = torch.linspace(-3.0, 3.0, 50)

    def draws(seed: int) -> list[int]:
        rng = new_rng(seed)
        return [pick(logits, temperature=1.0, top_p=0.9, rng=rng) for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert draws(2**32 - 1) == draws(2**32 - 1)


@given(LOGITS)
@settings(deadline=None)
def test_temperature_zero_is_argmax(logits: torch.Tensor) -> None:
    """OAI-CHAT-07, OAI-SEED-09: temperature 0 is greedy and ignores the rng."""
    expected = int(torch.argmax(logits))
    assert pick(logits, temperature=0.0, top_p=0.5, rng=new_rng(1)) == expected
    assert pick(logits, temperature=0.0, top_p=1.0, rng=None) == expected


def test_low_temperature_concentrates_on_the_best_token() -> None:
    """OAI-CHAT-06: temperature divides the logits before the draw."""
    logits = torch.tensor([1.0, 2.0, 0.5])
    rng = new_rng(3)
    cold = [pick(logits, temperature=0.01, top_p=1.0, rng=rng) for _ in range(50)]
    hot = [pick(logits, temperature=2.0, top_p=1.0, rng=rng) for _ in range(200)]
    assert set(cold) == {1}
    assert set(hot) == {0, 1, 2}


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    """OAI-CHAT-08: top_p keeps the smallest most-likely set with mass >= top_p."""
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))
    assert nucleus(logits, 0.5)[1].tolist() == [1]
    assert nucleus(logits, 0.79)[1].tolist() == [1, 3]
    assert nucleus(logits, 0.81)[1].tolist() == [1, 3, 2]
    assert nucleus(logits, 1.0)[1].tolist() == [1, 3, 2, 0]
    assert nucleus(logits, 0.0)[1].tolist() == [1]


@given(LOGITS, st.floats(min_value=0.0, max_value=1.0))
@settings(deadline=None)
def test_nucleus_is_minimal_and_never_empty(logits: torch.Tensor, top_p: float) -> None:
    """OAI-CHAT-08: the nucleus holds at least one token and no token too many."""
    probs, ids = nucleus(logits, top_p)
    assert len(ids) >= 1
    assert len(set(ids.tolist())) == len(ids)
    assert torch.all(probs[:-1] >= probs[1:])
    mass = torch.cumsum(probs, dim=0)
    assert len(ids) == 1 or float(mass[-2]) < top_p
    assert len(ids) == len(logits) or float(mass[-1]) >= top_p


@given(st.integers(min_value=0, max_value=2**32 - 1), st.floats(min_value=0.0, max_value=0.99))
@settings(deadline=None, max_examples=30)
def test_draws_stay_inside_the_nucleus(seed: int, top_p: float) -> None:
    """OAI-CHAT-08: a draw never leaves the top_p nucleus."""
    logits = torch.linspace(4.0, -4.0, 20)
    allowed = set(nucleus(logits, top_p)[1].tolist())
    rng = new_rng(seed)
    assert {pick(logits, temperature=1.0, top_p=top_p, rng=rng) for _ in range(20)} <= allowed


def test_zero_penalties_are_a_no_op() -> None:
    """OAI-CHAT-22, OAI-CHAT-23, OAI-CHAT-24: both penalties 0 change nothing."""
    assert is_no_op_penalty(0.0, 0.0)
    assert not is_no_op_penalty(0.0, 0.1)
    counts = torch.tensor([1.0, 5.0, 100.0])
    assert torch.equal(penalty_factors(counts, 0.0, 0.0), torch.ones(3))


def test_penalty_formula() -> None:
    """OAI-CHAT-24: penalty = e**presence * (1 + count)**frequency."""
    counts = torch.tensor([1.0, 3.0])
    factors = penalty_factors(counts, 0.5, 0.25)
    expected = [math.exp(0.25) * 2**0.5, math.exp(0.25) * 4**0.5]
    assert factors.tolist() == pytest.approx(expected, rel=1e-6)


@given(PENALTY, PENALTY, COUNT)
def test_penalty_stays_positive_and_finite(frequency: float, presence: float, count: int) -> None:
    """OAI-CHAT-22, OAI-CHAT-23: the full -2..2 ranges give a valid penalty."""
    factor = float(penalty_factors(torch.tensor([float(count)]), frequency, presence)[0])
    assert 0 < factor < math.inf


@given(PENALTY, PENALTY, PENALTY, COUNT)
def test_penalty_is_monotone(frequency: float, presence: float, more: float, count: int) -> None:
    """OAI-CHAT-24: a larger penalty never makes a repeat more likely."""
    counts = torch.tensor([float(count)], dtype=torch.float64)
    low, high = sorted((frequency, more))
    assert penalty_factors(counts, low, presence) <= penalty_factors(counts, high, presence)
    low, high = sorted((presence, more))
    assert penalty_factors(counts, frequency, low) <= penalty_factors(counts, frequency, high)


def test_penalties_push_seen_logits_toward_unlikely() -> None:
    """OAI-CHAT-24: HF's rule, positive logits divided and negative multiplied."""
    logits = torch.tensor([2.0, -2.0, 3.0, -1.0])
    seen = torch.tensor([0, 1])
    out = apply_penalties(
        logits, seen, torch.tensor([1.0, 1.0]), frequency=0.0, presence=math.log(2.0)
    )
    assert out.tolist() == pytest.approx([1.0, -4.0, 3.0, -1.0])
    assert logits.tolist() == [2.0, -2.0, 3.0, -1.0]


def test_negative_penalties_encourage_repeats() -> None:
    """OAI-CHAT-22, OAI-CHAT-23: negative values make seen tokens likelier."""
    logits = torch.tensor([2.0, -2.0, 3.0])
    seen = torch.tensor([0, 1])
    out = apply_penalties(logits, seen, torch.tensor([3.0, 3.0]), frequency=-1.0, presence=-1.0)
    assert out[0] > logits[0]
    assert out[1] > logits[1]
    assert out[2] == logits[2]
