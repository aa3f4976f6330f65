"""Circuit documents and the circuit dial (REQ-000 CIRCUIT, DIAL; issue 19 items 1 and 3),
without a model: parsing and its refusals, λ by the circuit rule against the cluster rule,
member re-derivation and the per-member clamp."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from miserver.steering import dial
from miserver.steering.circuit import CircuitError, parse

ENVELOPE = dial.Bounds.configured(0.0, 2.0)  # CIRCUIT_INTENSITY_MIN/MAX defaults
DOC: dict[str, Any] = {
    "schema": "mi.circuit/v1",
    "id": "crc_124fd83d1f2a",
    "members": [
        {"sae_id": "smollm2-l12", "layer": 12, "index": 5, "strength": 150.0},
        {"sae_id": "smollm2-l12", "layer": 12, "index": 77, "strength": 10.0},
        {"sae_id": "smollm2-l12", "layer": 6, "index": 5, "strength": -4.0},
    ],
    "intensity": 1.0,
    "intensity_range": [0.5, 1.5],
    "evidence": {"rung": 2, "ladder": [{"rung": 2, "summary": "edges patched"}]},
}


def test_the_circuit_dial_clamps_both_ways_and_the_cluster_dial_does_not() -> None:
    """OAI-CIRCUIT-03, -04, -05, -07, OAI-DIAL-08: 0.1 against [0.5, 1.5] is 0.5 on a
    circuit and 0.1 on a cluster; above the range is its ceiling; only 0 and "off" go to
    off; without a declared range "min" is "off"."""
    circuit = parse(DOC)
    assert circuit.dial(0.1, ENVELOPE) == 0.5
    assert dial.cluster_lambda(0.1, dial.Bounds.of([0.5, 1.5], ENVELOPE)) == 0.1
    assert circuit.dial(1.9, ENVELOPE) == 1.5
    assert circuit.dial(0, ENVELOPE) == circuit.dial("off", ENVELOPE) == 0.0
    assert (circuit.dial("min", ENVELOPE), circuit.dial("max", ENVELOPE)) == (0.5, 1.5)
    assert circuit.dial(None, ENVELOPE) == 1.0  # the persistent dial
    open_ended = parse({k: v for k, v in DOC.items() if k != "intensity_range"})
    assert open_ended.dial("min", ENVELOPE) == 0.0
    assert open_ended.dial("max", ENVELOPE) == 2.0
    assert open_ended.dial(0.1, ENVELOPE) == 0.1  # the default floor is 0.0 (CIRCUIT-06)


def test_the_configured_envelope_narrows_a_declared_range() -> None:
    """Open point 15: a declared range is intersected with [CIRCUIT_INTENSITY_MIN,
    CIRCUIT_INTENSITY_MAX] within [0, 2]."""
    narrow = dial.Bounds.configured(0.7, 1.2)
    circuit = parse(DOC)
    assert circuit.bounds(narrow) == dial.Bounds(0.7, 1.2)
    assert circuit.dial(0.1, narrow) == 0.7 and circuit.dial(1.5, narrow) == 1.2


def test_members_rederive_from_authored_strengths_and_saturate_one_by_one() -> None:
    """OAI-CIRCUIT-01, -02, -08, -09: one λ scales every layer; each (SAE, layer) gets its
    own members; strengths are authored × λ whatever the stored dial, and at high λ the
    strong member saturates at 200 while the weak one keeps scaling."""
    circuit = parse(DOC)
    low, high = circuit.applied(1.0), circuit.applied(2.0)
    assert [(a.layer, a.sae_id) for a in high] == [(6, "smollm2-l12"), (12, "smollm2-l12")]
    assert dict(low[1].strengths) == {5: 150.0, 77: 10.0} and low[1].clamped == 0
    assert dict(high[1].strengths) == {5: 200.0, 77: 20.0} and high[1].clamped == 1
    assert dict(high[0].strengths) == {5: -8.0}
    stored = parse({**DOC, "intensity": 1.7})
    assert [dict(a.strengths) for a in stored.applied(1.0)] == [dict(a.strengths) for a in low]
    assert [dict(a.strengths) for a in circuit.applied(0.0)] == [{}, {}]


@pytest.mark.parametrize(
    ("path", "value", "param"),
    [
        (("members", 1, "strength"), "strong", "members[1].strength"),
        (("members", 0, "layer"), -1, "members[0].layer"),
        (("evidence", "rung"), 4, "evidence.rung"),
        (("id",), "has space", "id"),
        (("intensity_range",), [1.5, 0.5], "intensity_range"),
        (("members", 2, "index"), 77, "members[2].index"),
    ],
    ids=["strength-type", "layer", "rung", "id", "range-order", "duplicate"],
)
def test_refusals_name_the_json_pointer(path: tuple[Any, ...], value: Any, param: str) -> None:
    """Issue 19 item 1: a document the schema or the rules refuse names the field."""
    doc = copy.deepcopy(DOC)
    if path == ("members", 2, "index"):
        doc["members"][2] = {**doc["members"][1]}
    else:
        node: Any = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    with pytest.raises(CircuitError) as caught:
        parse(doc)
    assert caught.value.param == param


def test_slice_fallback_needs_its_backing_cluster() -> None:
    """OAI-CIRCUIT-10: a slice_fallback circuit names the cluster that steers it."""
    with pytest.raises(CircuitError) as caught:
        parse({**DOC, "mode": "slice_fallback"})
    assert caught.value.param == "backing_cluster"
    fallback = parse({**DOC, "mode": "slice_fallback", "backing_cluster": "humor"})
    assert (fallback.mode, fallback.backing_cluster) == ("slice_fallback", "humor")


def test_the_rung_is_no_higher_than_its_ladder() -> None:
    """OAI-RUNG-03, OAI-RUNG-04: the rung the header renders comes from the evidence ladder: a
    document claiming rung 2 over a ladder that reached 1 is refused naming `evidence.rung`;
    a rung below the ladder's top (conservative) or without a ladder is taken as declared."""
    ladder = [{"rung": 0, "summary": "mined"}, {"rung": 1, "summary": "attribution"}]
    with pytest.raises(CircuitError) as caught:
        parse({**DOC, "evidence": {"rung": 2, "ladder": ladder}})
    assert caught.value.param == "evidence.rung"
    assert parse({**DOC, "evidence": {"rung": 0, "ladder": ladder}}).rung == 0
    assert parse({**DOC, "evidence": {"rung": 3}}).rung == 3
