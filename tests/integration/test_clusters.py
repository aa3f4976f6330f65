"""Clusters through HTTP (REQ-000 DIAL; issue 19 items 1 and 2): a `mi.cluster/v1` document
imported as a profile, its refusals naming the field, and its persistent dial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miserver.app import Server
from tests.conftest import SAE_ID, LocalClient, steering_settings

JSON = {"Content-Type": "application/json"}
DOC: dict[str, Any] = {
    "schema": "mi.cluster/v1",
    "name": "humor",
    "sae_id": SAE_ID,
    "layer": 12,
    "features": [{"index": 5, "strength": 4.0}, {"index": 77, "strength": -2.5}],
    "description": "funnier",
    "intensity": 1.2,
    "intensity_range": [0.5, 1.5],
}


def test_a_cluster_imports_as_a_profile_and_keeps_its_dial(tmp_path: Path, saes_dir: Path) -> None:
    """OAI-DIAL-01, OAI-DIAL-02, issue 19 items 1-2: POST /api/clusters stores the document
    as a profile (features, dial, range), replaced when sent again; a document the schema
    refuses, or one naming an SAE the saes directory lacks or a feature past its d_sae, is
    400 naming the field and stores nothing; PUT /api/profiles/{name}/dial sets
    only the persistent dial, which survives a restart; an unknown name is 404."""
    settings = steering_settings(tmp_path / "data", saes_dir)
    with LocalClient(Server(settings, preload=False)) as client:
        created = client.post("/api/clusters", json=DOC)
        assert created.status_code == 201, created.text
        profile = created.json()["profile"]
        assert (profile["intensity"], profile["intensity_range"]) == (1.2, [0.5, 1.5])
        assert [f["index"] for f in profile["features"]] == [5, 77]
        assert client.post("/api/clusters", json=DOC).status_code == 200
        bad = {**DOC, "name": "other", "features": [DOC["features"][0], {"index": 1}]}
        refused = client.post("/api/clusters", json=bad)
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, "features[1]")
        wrong = client.post("/api/clusters", json={**DOC, "schema": "mi.circuit/v1"})
        assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "schema")
        unknown = client.post("/api/clusters", json={**DOC, "name": "other", "sae_id": "nope"})
        assert (unknown.status_code, unknown.json()["error"]["param"]) == (400, "sae_id")
        past = {**DOC, "name": "other", "features": [{"index": 2048, "strength": 1.0}]}
        beyond = client.post("/api/clusters", json=past)
        assert (beyond.status_code, beyond.json()["error"]["param"]) == (400, "features[0].index")
        assert client.get("/api/profiles/other").status_code == 404
        dialled = client.put("/api/profiles/humor/dial", json={"intensity": 0.7})
        assert dialled.status_code == 200, dialled.text
        assert dialled.json()["profile"]["intensity"] == 0.7
        assert dialled.json()["profile"]["features"] == profile["features"]
        too_high = client.put("/api/profiles/humor/dial", json={"intensity": 2.5})
        assert too_high.status_code == 400
        missing = client.put("/api/profiles/nobody/dial", json={"intensity": 1.0})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "profile_not_found")
    with LocalClient(Server(settings, preload=False)) as client:
        again = client.get("/api/profiles/humor").json()
        assert (again["intensity"], again["intensity_range"], again["description"]) == (
            0.7,
            [0.5, 1.5],
            "funnier",
        )
