"""Scoring arithmetic without a model: normalisation, the non-finite rules, key merging."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from miserver.engines.base import NonFiniteLogits, Scored, ScoreQuery
from miserver.engines.logprobs import scored
from miserver.errors import ApiError
from miserver.serving.completions.scoring import ScoringAsk, ScoringReply, check_mode, unused_fields

INF = float("inf")
NAN = float("nan")


def logits(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_allowed_ids_are_normalised_over_the_set() -> None:
    """OAI-SCORE-03/04/05/12: log_softmax over the allowed ids only; all of them reported."""
    got = scored(logits(5.0, 1.0, 2.0, 0.5), ScoreQuery(0.0, (1, 3), 2))
    assert [i for i, _ in got.alternatives] == [1, 3]
    assert math.isclose(sum(math.exp(lp) for _, lp in got.alternatives), 1.0, abs_tol=1e-12)
    assert got.best == got.alternatives[0] and got.best[0] == 1


def test_temperature_divides_and_zero_does_not_scale() -> None:
    """OAI-SCORE-13."""
    raw = logits(2.0, 1.0, 0.0)
    plain = scored(raw, ScoreQuery(0.0, None, 3))
    expected = torch.log_softmax(raw.double(), -1)
    assert [lp for _, lp in plain.alternatives] == pytest.approx(expected.tolist(), abs=1e-7)
    hot = scored(raw, ScoreQuery(2.0, None, 3))
    halved = torch.log_softmax(raw.double() / 2, -1)
    assert [lp for _, lp in hot.alternatives] == pytest.approx(halved.tolist(), abs=1e-7)


@pytest.mark.parametrize(
    ("values", "allowed", "alternatives", "fails"),
    [
        ((1.0, NAN, 0.0), (1, 2), 2, True),
        ((1.0, INF, 0.0), (0, 1), 1, True),
        ((1.0, NAN, 0.0), None, 1, True),
        ((1.0, 0.0, INF), None, 0, True),
        ((1.0, -INF, 0.0), None, 3, True),
        ((1.0, NAN, -INF), (0,), 1, False),
        ((1.0, -INF, 0.0), (0, 2), 2, False),
        ((1.0, -INF, 0.0), None, 2, False),
    ],
    ids=[
        "SCORE-22-nan-allowed",
        "SCORE-22-inf-allowed",
        "SCORE-23-nan-anywhere",
        "SCORE-23-inf-anywhere",
        "SCORE-24-reported-neg-inf",
        "SCORE-25-outside-set",
        "SCORE-25-neg-inf-outside",
        "SCORE-24-neg-inf-unreported",
    ],
)
def test_non_finite_logits(
    values: tuple[float, ...], allowed: tuple[int, ...] | None, alternatives: int, fails: bool
) -> None:
    """OAI-SCORE-22..25: where non-finite logits reach the answer, scoring fails."""
    query = ScoreQuery(0.0, allowed, alternatives)
    if fails:
        with pytest.raises(NonFiniteLogits):
            scored(logits(*values), query)
    else:
        scored(logits(*values), query)


def reply(endpoint: str, as_ids: bool = False) -> ScoringReply:
    texts = {1: "yes", 2: "yes", 3: "no", 4: "é"}
    ask = ScoringAsk(logprobs=True, alternatives=3, allowed=None, as_ids=as_ids, precision=None)
    return ScoringReply(endpoint, ask, texts.__getitem__)


SCORED = Scored(
    best=(1, math.log(0.5)),
    alternatives=((1, math.log(0.5)), (2, math.log(0.3)), (3, math.log(0.2))),
)


def test_equal_texts_share_one_entry_with_summed_probability() -> None:
    """OAI-SCORE-18: two ids decoding alike share one entry (log of summed probabilities)."""
    choice = reply("completions").choice(0, SCORED, "x" * 11, [5])
    top = choice["logprobs"]["top_logprobs"][0]
    assert set(top) == {"yes", "no"}
    assert math.isclose(math.exp(top["yes"]), 0.8) and math.isclose(math.exp(top["no"]), 0.2)
    assert choice["logprobs"]["token_logprobs"] == [math.log(0.5)]
    assert choice["logprobs"]["text_offset"] == [11] and choice["text"] == "yes"


def test_token_ids_keep_entries_apart() -> None:
    """OAI-SCORE-07: `token_id:<id>` keys never merge."""
    choice = reply("completions", as_ids=True).choice(0, SCORED, "", [5])
    top = choice["logprobs"]["top_logprobs"][0]
    assert list(top) == ["token_id:1", "token_id:2", "token_id:3"]


def test_chat_entries_carry_bytes() -> None:
    """OAI-CSCORE-13..17: one content entry; bytes are the decoded text's UTF-8."""
    result = Scored(best=(4, -0.1), alternatives=((4, -0.1), (3, -2.4)))
    choice = reply("chat", as_ids=True).choice(0, result, "", [5])
    [entry] = choice["logprobs"]["content"]
    assert entry["token"] == "token_id:4" and entry["bytes"] == [0xC3, 0xA9]
    assert [t["token"] for t in entry["top_logprobs"]] == ["token_id:4", "token_id:3"]
    assert choice["message"] == {"role": "assistant", "content": "é", "refusal": None}


@pytest.mark.parametrize(
    ("rule", "param"),
    [
        ({"max_tokens": 2, "n": 1, "stream": False, "temperature": 0.0}, "max_tokens"),
        ({"max_tokens": None, "n": 1, "stream": False, "temperature": 0.0}, "max_tokens"),
        ({"max_tokens": 1, "n": 2, "stream": False, "temperature": 0.0}, "n"),
        ({"max_tokens": 1, "n": 1, "stream": True, "temperature": 0.0}, "stream"),
        ({"max_tokens": 1, "n": 1, "stream": False, "temperature": 0.0005}, "temperature"),
    ],
    ids=["OAI-SCORE-09", "OAI-SCORE-09-absent", "OAI-SCORE-10", "OAI-CSCORE-06", "OAI-SCORE-26"],
)
def test_a_broken_scoring_rule_is_invalid_parameter(rule: dict[str, Any], param: str) -> None:
    """REQ-000 open point 9: a scoring rule broken is 400 invalid_parameter naming the field
    (OAI-ERR-16 keeps invalid_scoring_request for vocabulary ids and empty prompts)."""
    with pytest.raises(ApiError) as refused:
        check_mode({}, **rule)
    assert (refused.value.code, refused.value.param, refused.value.status) == (
        "invalid_parameter",
        param,
        400,
    )


def test_a_seed_is_not_an_unused_scoring_field() -> None:
    """OAI-SEED-10: a seed on a scoring request is used (echoed), never reported unused;
    top_p and the other sampling fields still are (OAI-SCORE-14, OAI-VALID-02)."""
    body = {"seed": 7, "top_p": 0.5, "stop": ["x"], "frequency_penalty": 1.0}
    assert unused_fields(body) == ["top_p", "stop", "frequency_penalty"]
