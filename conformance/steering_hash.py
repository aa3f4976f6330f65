"""The steering-set hash, written from REQ-000 HASH (OAI-HASH-02..13), independently of the server.

The applied set maps each feature index to `clamp(strength, -200, 200)` in
binary64, zeros (and -0.0) dropped. Its canonical form is UTF-8 lines, each
ended by one LF:

    millm.steering-set/v1
    sae=<sae_id>
    <index>:<16 lowercase hex digits of the strength's big-endian binary64>

one feature line per applied index in ascending numeric order. The hash is
`"sha256:" + hex(SHA-256(canonical form))`.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

DOMAIN = "millm.steering-set/v1"
CLAMP = 200.0


def applied_set(features: Iterable[tuple[int, float]]) -> dict[int, float]:
    """index -> the strength the hook applies: clamped to ±200, zeros dropped (later wins)."""
    applied: dict[int, float] = {}
    for index, strength in features:
        applied[index] = max(-CLAMP, min(CLAMP, float(strength)))
    return {index: value for index, value in applied.items() if value != 0.0}


def clamped_count(features: Iterable[tuple[int, float]]) -> int:
    """How many strengths the ±200 clamp changes (the `clamped=` parameter, OAI-GRAM-17)."""
    return sum(1 for _, strength in features if abs(float(strength)) > CLAMP)


def canonical_form(sae_id: str, features: Iterable[tuple[int, float]]) -> str:
    """The text that is hashed (OAI-HASH-07..12)."""
    applied = applied_set(features)
    lines = [DOMAIN, f"sae={sae_id}"]
    lines += [f"{index}:{struct.pack('>d', applied[index]).hex()}" for index in sorted(applied)]
    return "".join(line + "\n" for line in lines)


def steering_set_hash(sae_id: str, features: Iterable[tuple[int, float]]) -> str:
    """`sha256:<64 lowercase hex>` of the canonical form (OAI-HASH-13)."""
    digest = hashlib.sha256(canonical_form(sae_id, features).encode("utf-8")).hexdigest()
    return f"sha256:{digest}"
