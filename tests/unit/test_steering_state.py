"""The live steering state, the dial, request resolution and the request source, without a model.

Tiny SAEs (d_in 8, d_sae 16, hook layer 3) stand in for the trained one:
everything here is arithmetic on the state, the hash and the header.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miserver.errors import ApiError
from miserver.steering import steering_set_hash
from miserver.steering.dial import Bounds, cluster_lambda, is_off
from miserver.steering.header import ManualMember, ProfileMember, parse
from miserver.steering.live import LiveSteering
from miserver.steering.request import InlineSet, SteeringAsk, resolve_steering
from miserver.steering.sae import SAERegistry
from miserver.steering.source import RequestSource
from miserver.store.circuits import CircuitStore
from miserver.store.database import Database
from miserver.store.profiles import ProfileStore
from tests.saes import cfg_for, weights_for, write_sae

MODEL = "tiny"
DEFAULT = Bounds.configured(0.5, 2.0)


@pytest.fixture
def live(tmp_path: Path, database_at: Path | str) -> LiveSteering:
    """Live steering on a SQLite file, then on a PostgreSQL database."""
    saes = tmp_path / "saes"
    for name, seed in (("a", 0), ("b", 1)):
        write_sae(saes / name, cfg_for("standard"), weights_for("standard", seed))
    db = Database(database_at)
    state = LiveSteering(
        SAERegistry(saes),
        ProfileStore(db),
        db,
        DEFAULT,
        circuits=CircuitStore(db),
        circuit_bounds=Bounds.configured(0.0, 2.0),
    )
    state.attach(MODEL, "a", None, width=8, depth=6)
    return state


@pytest.mark.parametrize(
    ("value", "declared", "expected"),
    [
        ("off", None, 0.0),
        (0, None, 0.0),
        ("min", None, 0.5),  # CLUSTER_INTENSITY_MIN when no range is declared
        ("max", None, 2.0),
        (1.7, None, 1.7),
        ("min", (0.25, 1.5), 0.25),
        ("max", (0.25, 1.5), 1.5),
        (1.9, (0.25, 1.5), 1.5),  # capped at the declared maximum
        (0.1, (0.5, 1.5), 0.1),  # never raised to the floor
        ("max", (0.5, 3.0), 2.0),  # intersected with the [0, 2] envelope
    ],
    ids=[
        "DIAL-11-off",
        "DIAL-11-zero",
        "DIAL-09-min-default",
        "DIAL-07-max-default",
        "DIAL-07-numeric",
        "DIAL-04-min",
        "DIAL-05-max",
        "DIAL-06-cap",
        "DIAL-08-below-floor",
        "DIAL-05-envelope",
    ],
)
def test_dial(value: float | str, declared: tuple[float, float] | None, expected: float) -> None:
    """OAI-DIAL-04..09, OAI-DIAL-11 (REQ-000 open points 14, 15)."""
    assert cluster_lambda(value, Bounds.of(declared, DEFAULT)) == expected


def test_is_off() -> None:
    """OAI-DIAL-11: only 0 and "off" turn steering off."""
    assert is_off("off") and is_off(0) and is_off(0.0)
    assert not is_off("min") and not is_off(None) and not is_off(0.01)


def test_profile_strengths_scale_by_lambda_then_clamp(live: LiveSteering) -> None:
    """OAI-HASH-06, OAI-DIAL-01/03, OAI-INL-13: clamp(stored × λ) in binary64, clamps counted;
    the stored dial is unchanged by a request's λ."""
    live.profiles.save("p", "a", 3, [(1, 150.0), (2, 0.1), (3, 0.0)], intensity=0.5)
    epoch = live.epoch
    got = resolve_steering(SteeringAsk(profile="p", intensity=1.5), live, MODEL, True)
    assert got.echo == 1.5 and got.override is not None
    [member] = got.override.members()
    assert isinstance(member, ProfileMember)
    assert member.intensity == 1.5 and member.clamped == 1 and member.features == 2
    assert member.hash == steering_set_hash("a", [(1, 200.0), (2, 0.1 * 1.5)])
    assert live.profiles.get("p").intensity == 0.5 and live.epoch == epoch


def test_inline_replaces_everything_and_moves_no_epoch(live: LiveSteering) -> None:
    """OAI-INL-04, OAI-INL-17, OAI-INL-18: the set on one SAE, nothing else, epoch unmoved."""
    live.attach(MODEL, "b", 2, width=8, depth=6)
    live.set_manual(MODEL, "b", 2, {4: 3.0})
    epoch = live.epoch
    ask = SteeringAsk(inline=InlineSet("a", ((1, 2.0),)))
    got = resolve_steering(ask, live, MODEL, True)
    assert got.override is not None and [i.sae.sae_id for i in got.override.items] == ["a"]
    assert live.epoch == epoch


def test_inline_refusals(live: LiveSteering) -> None:
    """OAI-INL-07, -08, -09, -16, -19, -21, -22, -23."""

    def code(ask: SteeringAsk, resident: bool = True) -> tuple[str, str | None]:
        with pytest.raises(ApiError) as caught:
            resolve_steering(ask, live, MODEL, resident)
        return caught.value.code, caught.value.param

    one = ((1, 1.0),)
    assert code(SteeringAsk(inline=InlineSet(None, one)), resident=False)[0] == "SAE_NOT_ATTACHED"
    assert code(SteeringAsk(inline=InlineSet("b", one))) == ("SAE_NOT_ATTACHED", "steering.sae_id")
    assert code(SteeringAsk(inline=InlineSet("a", ()))) == ("invalid_parameter", "steering.sae_id")
    assert code(SteeringAsk(inline=InlineSet(None, ((16, 1.0),)))) == (
        "INVALID_FEATURE_INDEX",
        "steering.features[0].index",
    )
    assert code(SteeringAsk(inline=InlineSet(None, ((1, 1.0), (1, 2.0)))))[1] == (
        "steering.features[1].index"
    )
    assert code(SteeringAsk(profile="p", inline=InlineSet(None, one)))[1] == "steering"
    live.attach(MODEL, "a", 5, width=8, depth=6)  # one SAE at two layers: ambiguous without a layer
    with pytest.raises(ApiError, match=r"\(a, layer 3\), \(a, layer 5\)"):
        resolve_steering(SteeringAsk(inline=InlineSet(None, one)), live, MODEL, True)


def test_an_operator_change_wins_over_the_request(live: LiveSteering) -> None:
    """OAI-CONC-01/02, OAI-HDR-02/03: hooks read the request's set until the epoch moves, then
    the operator's; the header reports the end state with `changed`; nothing is restored."""
    got = resolve_steering(SteeringAsk(inline=InlineSet(None, ((1, 5.0),))), live, MODEL, True)
    source = RequestSource(live, MODEL, got.override)
    assert source.layers() == {3}
    first = source.vector(3)
    assert first is not None and torch.allclose(first, 5.0 * live.saes.get("a").W_dec[1])
    assert "inline;" in source.header() and not source.changed()
    live.set_manual(MODEL, "a", 3, {2: 7.0})
    second = source.vector(3)
    assert second is not None and torch.allclose(second, 7.0 * live.saes.get("a").W_dec[2])
    [member] = parse(source.header())
    assert isinstance(member, ManualMember) and member.changed and source.mixed()
    assert live.attachments(MODEL)[0].manual == {2: 7.0}


def test_manual_values_are_refused_past_the_clamp(live: LiveSteering) -> None:
    """`manual` members never carry `clamped` (OAI-GRAM-10), so live values stay within ±200."""
    with pytest.raises(ApiError) as caught:
        live.set_manual(MODEL, "a", 3, {1: 250.0})
    assert caught.value.param == "features"
