"""Imported circuits, persisted: each `mi.circuit/v1` document as sent, its dial and
whether it is active (one of the steering bases), so all three survive a restart.

The store keeps the document's text and never interprets it: steering/circuit.py
parses it, and a row it can no longer parse stays listed, unreadable
(OAI-RUNG-11), until it is replaced or deleted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .database import Database, upsert

SAVE = upsert("circuits", ("id",), ("id", "document", "intensity", "active", "created", "updated"))


class CircuitNotFound(KeyError):
    """No circuit has this id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CircuitRow:
    id: str
    document: str  # the JSON text as imported
    intensity: float  # the persistent dial λ
    active: bool
    created: float
    updated: float

    def parsed(self) -> Any:
        """The document as JSON (ValueError when the stored text is not JSON)."""
        return json.loads(self.document)


class CircuitStore:
    def __init__(self, database: Database) -> None:
        self._db = database

    def save(self, circuit_id: str, document: Mapping[str, Any], intensity: float) -> bool:
        """Create or replace `circuit_id` (its active flag kept); True when created."""
        text = json.dumps(document, sort_keys=True, allow_nan=False)
        now = time.time()
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT created, active FROM circuits WHERE id = ?", (circuit_id,)
            ).fetchone()
            created, active = (float(row[0]), int(row[1])) if row else (now, 0)
            db.execute(
                SAVE,
                (circuit_id, text, float(intensity), active, created, now),
            )
        return row is None

    def get(self, circuit_id: str) -> CircuitRow:
        with self._db.transaction() as db:
            row = db.execute("SELECT * FROM circuits WHERE id = ?", (circuit_id,)).fetchone()
        if row is None:
            raise CircuitNotFound(circuit_id)
        return _row(row)

    def rows(self) -> list[CircuitRow]:
        with self._db.transaction() as db:
            rows = db.execute("SELECT * FROM circuits ORDER BY id").fetchall()
        return [_row(row) for row in rows]

    def active(self) -> list[CircuitRow]:
        """The active circuits, by id."""
        return [row for row in self.rows() if row.active]

    def delete(self, circuit_id: str) -> None:
        with self._db.transaction() as db:
            if db.execute("DELETE FROM circuits WHERE id = ?", (circuit_id,)).rowcount == 0:
                raise CircuitNotFound(circuit_id)

    def set_dial(self, circuit_id: str, intensity: float) -> None:
        self._update(circuit_id, "intensity", float(intensity))

    def set_active(self, circuit_id: str, active: bool) -> None:
        self._update(circuit_id, "active", int(active))

    def _update(self, circuit_id: str, column: str, value: float | int) -> None:
        assert column in ("intensity", "active")
        with self._db.transaction() as db:
            changed = db.execute(
                f"UPDATE circuits SET {column} = ?, updated = ? WHERE id = ?",
                (value, time.time(), circuit_id),
            ).rowcount
        if changed == 0:
            raise CircuitNotFound(circuit_id)


def _row(row: Sequence[object]) -> CircuitRow:
    circuit_id, document, intensity, active, created, updated = row
    return CircuitRow(
        id=str(circuit_id),
        document=str(document),
        intensity=float(str(intensity)),
        active=bool(int(str(active))),
        created=float(str(created)),
        updated=float(str(updated)),
    )
