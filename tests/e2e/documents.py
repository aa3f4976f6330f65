"""Steering documents the live tests import: a two-layer circuit and a cluster on the
trained SAEs (tests.conftest SAE_ID at layer 12, OTHER_SAE_ID at layer 6)."""

from __future__ import annotations

from typing import Any

from tests.conftest import OTHER_SAE_ID, SAE_ID

CIRCUIT: dict[str, Any] = {
    "schema": "mi.circuit/v1",
    "id": "crc_live",
    "members": [
        {"sae_id": OTHER_SAE_ID, "layer": 6, "index": 5, "strength": 60.0},
        {"sae_id": SAE_ID, "layer": 12, "index": 9, "strength": -80.0},
        {"sae_id": SAE_ID, "layer": 12, "index": 5, "strength": 40.0},
    ],
    "intensity_range": [0.5, 1.5],
    "evidence": {"rung": 3, "ladder": [{"rung": 3, "summary": "faithfulness-tested"}]},
}
CLUSTER: dict[str, Any] = {
    "schema": "mi.cluster/v1",
    "name": "live-cluster",
    "sae_id": SAE_ID,
    "layer": 12,
    "features": [{"index": 9, "strength": -80.0}],
    "intensity_range": [0.5, 1.5],
}
