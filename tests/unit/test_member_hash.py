"""Cluster and circuit member hashes (REQ-000 HASH, CIRCUIT-08/09; issue 19 item 4) over
spec/vectors/steering-member-hash.json: the server's code and the conformance kit's
independent hash agree with every vector."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from miserver.conformance import steering_hash as kit
from miserver.steering.circuit import Circuit, Member
from miserver.steering.hashing import steering_set_hash
from miserver.steering.header import profile_member

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("miserver.spec") / "vectors" / "steering-member-hash.json").read_text("utf-8")
)
CLUSTERS = [v for v in VECTORS if v["kind"] == "cluster"]
CIRCUITS = [v for v in VECTORS if v["kind"] == "circuit"]


def test_at_least_ten_vectors_of_both_kinds() -> None:
    """Issue 19 acceptance: >= 10 new hash vectors, clusters and circuits both."""
    assert len(VECTORS) >= 10 and CLUSTERS and CIRCUITS
    assert len({v["id"] for v in VECTORS}) == len(VECTORS)


@pytest.mark.parametrize("vector", CLUSTERS, ids=[v["id"] for v in CLUSTERS])
def test_cluster_member_hash(vector: dict[str, Any]) -> None:
    """OAI-HASH-06, OAI-HASH-19, OAI-DIAL-01: a profile member's hash is over
    clamp(stored × λ) in binary64; the applied set and clamp count are as pinned."""
    lam = vector["intensity"]
    stored = [(f["index"], f["strength"]) for f in vector["stored"]]
    applied = {f["index"]: f["strength"] for f in vector["applied"]}
    scaled = [(i, s * lam) for i, s in stored]
    assert kit.applied_set(scaled) == applied
    assert kit.clamped_count(scaled) == vector["clamped"]
    assert kit.steering_set_hash(vector["sae_id"], scaled) == vector["hash"]
    member = profile_member(
        "c", "active", lam, vector["sae_id"], layer=12, applied=applied, clamped=vector["clamped"]
    )
    assert (member.hash, member.features) == (vector["hash"], len(applied))


@pytest.mark.parametrize("vector", CIRCUITS, ids=[v["id"] for v in CIRCUITS])
def test_circuit_layer_hashes(vector: dict[str, Any]) -> None:
    """OAI-CIRCUIT-02, OAI-CIRCUIT-08, OAI-CIRCUIT-09, OAI-HASH-02: one entry per (SAE,
    layer), each member at clamp(authored × λ) one by one, hashed without the layer."""
    members = tuple(
        Member(m["sae_id"], m["layer"], m["index"], m["strength"]) for m in vector["members"]
    )
    circuit = Circuit(id=vector["id"], members=members, rung=0)
    got = [
        {
            "sae_id": g.sae_id,
            "layer": g.layer,
            "applied": [{"index": i, "strength": g.strengths[i]} for i in sorted(g.strengths)],
            "clamped": g.clamped,
            "hash": steering_set_hash(g.sae_id, list(g.strengths.items())),
        }
        for g in circuit.applied(vector["intensity"])
    ]
    assert got == vector["layers"]
    for layer in vector["layers"]:  # the kit, from the members alone
        mine = [
            m
            for m in vector["members"]
            if (m["sae_id"], m["layer"]) == (layer["sae_id"], layer["layer"])
        ]
        scaled = [(m["index"], m["strength"] * vector["intensity"]) for m in mine]
        assert kit.steering_set_hash(layer["sae_id"], scaled) == layer["hash"]
        assert kit.clamped_count(scaled) == layer["clamped"]
