"""What a `return_sae_activations` ask means and when it is refused (OAI-ACT), on a small
hand-made SAE whose activations are known."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from miserver.errors import InvalidParameter
from miserver.serving.completions.activations import (
    ActivationsAsk,
    check_ask,
    check_entries,
    check_sae,
    choose_sae,
    read_positions,
)
from miserver.serving.completions.reading import Reading, read
from miserver.steering.sae import SAE

WIDTH, FEATURES = 4, 6


def identity_sae() -> SAE:
    """A ReLU SAE whose features 0..3 are the residual's own coordinates and 4, 5 their
    negations: activations are easy to state."""
    w_enc = torch.cat([torch.eye(WIDTH), -torch.eye(WIDTH)[:, :2]], dim=1)
    return SAE(
        sae_id="tiny",
        architecture="standard",
        d_in=WIDTH,
        d_sae=FEATURES,
        layer=3,
        hook_name="blocks.3.hook_resid_post",
        W_enc=w_enc,
        W_dec=w_enc.T.contiguous(),
        b_enc=torch.zeros(FEATURES),
        b_dec=torch.zeros(WIDTH),
    )


def refused(call: Any, param: str, *words: str) -> None:
    with pytest.raises(InvalidParameter) as caught:
        call()
    assert caught.value.param == param
    for word in words:
        assert word in caught.value.message


def test_the_ask_takes_its_fields_and_defaults() -> None:
    """OAI-ACT-01/03/09: every field read; defaults last, top_k 8, post_steering."""
    assert ActivationsAsk.of({}) == ActivationsAsk()
    assert ActivationsAsk.of({"positions": None, "top_k": None, "read_point": None}) == (
        ActivationsAsk()
    )
    ask = ActivationsAsk.of(
        {
            "sae_id": "s",
            "features": [3, 1],
            "top_k": 2,
            "positions": {"start": 1, "end": 4},
            "read_point": "pre_steering",
        }
    )
    assert ask == ActivationsAsk(
        sae_id="s", features=(3, 1), top_k=2, positions=(1, 4), read_point="pre_steering"
    )
    assert ask.pre_steering and not ActivationsAsk().pre_steering


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        pytest.param({"top_k": 65}, "return_sae_activations.top_k", id="OAI-ACT-22-top-k"),
        pytest.param({"top_k": 0}, "return_sae_activations.top_k", id="top-k-zero"),
        pytest.param(
            {"positions": "first"}, "return_sae_activations.positions", id="OAI-ACT-03-name"
        ),
        pytest.param(
            {"positions": {"start": 5, "end": 2}},
            "return_sae_activations.positions",
            id="OAI-ACT-03-range",
        ),
        pytest.param(
            {"read_point": "unsteered"}, "return_sae_activations.read_point", id="read-point"
        ),
    ],
)
def test_refusals_without_the_sae(fields: dict[str, Any], param: str) -> None:
    """OAI-ACT-22: top_k over SAE_ACTIVATIONS_MAX_TOP_K; a malformed position or read point."""
    ask = ActivationsAsk.of(fields)
    refused(lambda: check_ask(ask, max_top_k=64), param)
    check_ask(ActivationsAsk.of({"top_k": 64}), max_top_k=64)


def test_a_feature_at_or_past_the_width_is_refused() -> None:
    """OAI-ACT-21: an index >= d_sae is named with its place in `features`."""
    sae = identity_sae()
    check_sae(ActivationsAsk(features=(0, FEATURES - 1)), sae)
    refused(
        lambda: check_sae(ActivationsAsk(features=(1, FEATURES)), sae),
        "return_sae_activations.features[1]",
        "0..5",
    )


def test_the_sae_is_the_one_named_or_the_only_one() -> None:
    """OAI-ACT-19/20: none attached, an unknown name, or several with none named: 400,
    naming the candidates."""
    assert choose_sae(ActivationsAsk(), ["a"]) == "a"
    assert choose_sae(ActivationsAsk(sae_id="b"), ["a", "b"]) == "b"
    refused(lambda: choose_sae(ActivationsAsk(), []), "return_sae_activations", "no SAE")
    refused(
        lambda: choose_sae(ActivationsAsk(sae_id="c"), ["a", "b"]),
        "return_sae_activations.sae_id",
        "`c`",
        "a, b",
    )
    refused(
        lambda: choose_sae(ActivationsAsk(), ["b", "a"]),
        "return_sae_activations.sae_id",
        "a, b",
    )


@pytest.mark.parametrize(
    ("positions", "worst"),
    [
        pytest.param("last", 1, id="last"),
        pytest.param("prompt", 100, id="prompt"),
        pytest.param("completion", 500, id="OAI-ACT-23-completion"),
        pytest.param("all", 600, id="OAI-ACT-23-all"),
        pytest.param((10, 30), 20, id="range"),
    ],
)
def test_the_worst_case_counts_max_tokens_in_full(
    positions: str | tuple[int, int], worst: int
) -> None:
    """OAI-ACT-23: positions x top_k against SAE_ACTIVATIONS_MAX_ENTRIES, `max_tokens` in full
    for completion and all."""
    ask = ActivationsAsk(positions=positions, top_k=4)
    assert ask.worst_case_positions(100, 500) == worst
    check_entries(ask, prompt_tokens=100, max_tokens=500, max_entries=worst * 4)
    refused(
        lambda: check_entries(ask, prompt_tokens=100, max_tokens=500, max_entries=worst * 4 - 1),
        "return_sae_activations",
        "SAE_ACTIVATIONS_MAX_ENTRIES",
    )


def test_positions_read_are_among_those_fed() -> None:
    """OAI-ACT-04/05/06: absolute over prompt then completion; the last sampled token was
    never fed, so it is never read."""
    # 5 prompt tokens, 3 generated: fed are the 5 and the first 2 generated
    assert read_positions("all", 5, 7) == range(0, 7)
    assert read_positions("prompt", 5, 7) == range(0, 5)
    assert read_positions("completion", 5, 7) == range(5, 7)
    assert read_positions("last", 5, 7) == range(6, 7)
    assert read_positions((3, 100), 5, 7) == range(3, 7)
    assert read_positions((8, 9), 5, 7) == range(7, 7)
    assert read_positions("completion", 5, 5) == range(5, 5)  # one token: none fed back


def entry(position: int, token_id: int, *features: tuple[int, float]) -> dict[str, Any]:
    listed = [{"index": index, "value": value} for index, value in features]
    return {"position": position, "token_id": token_id, "features": listed}


def test_read_lists_the_largest_candidates_per_position() -> None:
    """OAI-ACT-06/07/08/12/13: per position its token id and the top_k largest candidate
    activations, largest first, a tie broken by the lower index."""
    sae = identity_sae()
    rows = torch.tensor(
        [[1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, 0.5, 0.0], [2.0, 2.0, -3.0, 1.0]],
    )
    body = read(
        Reading(ActivationsAsk(positions="all", top_k=2), sae, "tiny", 3), rows, [7, 8, 9], 2
    )
    assert body["sae_id"] == "tiny" and body["layer"] == 3
    assert body["read_point"] == "post_steering"
    assert "not an unsteered counterfactual" in body["note"]
    assert body["positions"] == [
        entry(0, 7, (3, 4.0), (2, 3.0)),
        entry(1, 8, (5, 2.0), (4, 1.0)),
        entry(2, 9, (0, 2.0), (1, 2.0)),
    ]
    ask = ActivationsAsk(positions=(1, 2), top_k=3, features=(2, 0), read_point="pre_steering")
    narrowed = read(
        Reading(ask, sae, "tiny", 3),
        rows,
        [7, 8, 9],
        2,
    )
    assert narrowed["read_point"] == "pre_steering"
    assert narrowed["positions"] == [entry(1, 8, (2, 0.5), (0, 0.0))]
    empty = read(
        Reading(ActivationsAsk(positions="completion"), sae, "tiny", 3), rows[:2], [7, 8], 2
    )
    assert empty["positions"] == []
