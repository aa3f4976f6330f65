"""Probes and the results they recorded, persisted (REQ-000 PROBE; /api/probes).

A probe's definition is stored as JSON without its linear weight, which is a
float32 little-endian blob beside it: the probe survives a restart and the
files it was imported from moving. The store keeps the definition as given and
never interprets it: probes/admin.py makes a `Probe` of each row. Results are
`mi.probe.result/v1` objects in arrival order (`seq`); the newest `keep` stay.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .database import Database, upsert

SAVE = upsert("probes", ("name",), ("name", "definition", "weight", "armed", "created", "updated"))


class ProbeNotFound(KeyError):
    """No probe has this name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRow:
    name: str
    definition: dict[str, Any]  # the probe as JSON, a linear weight left out
    weight: tuple[float, ...] | None  # a linear detector's weight, read back as float32
    armed: bool
    created: float
    updated: float


def _row(row: Sequence[Any]) -> ProbeRow:
    name, definition, blob, armed, created, updated = row
    return ProbeRow(
        name=str(name),
        definition=json.loads(str(definition)),
        weight=struct.unpack(f"<{len(blob) // 4}f", bytes(blob)) if blob else None,
        armed=bool(armed),
        created=float(created),
        updated=float(updated),
    )


class ProbeStore:
    def __init__(self, database: Database, *, keep: int = 100_000) -> None:
        self._db = database
        self._keep = keep

    # -- probes ------------------------------------------------------------------

    def save(
        self, name: str, definition: Mapping[str, Any], weight: Sequence[float], *, armed: bool
    ) -> tuple[ProbeRow, bool]:
        """Create or replace `name`; the stored row and whether it is new."""
        now = time.time()
        blob = struct.pack(f"<{len(weight)}f", *weight)
        text = json.dumps(definition, sort_keys=True)
        with self._db.transaction() as db:
            row = db.execute("SELECT created FROM probes WHERE name = ?", (name,)).fetchone()
            created = float(row[0]) if row else now
            db.execute(
                SAVE,
                (name, text, blob, int(armed), created, now),
            )
        # read back: what a restart would see (a weight rounded to float32 included)
        return self.get(name), row is None

    def get(self, name: str) -> ProbeRow:
        with self._db.transaction() as db:
            row = db.execute("SELECT * FROM probes WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise ProbeNotFound(name)
        return _row(row)

    def every(self) -> list[ProbeRow]:
        with self._db.transaction() as db:
            rows = db.execute("SELECT * FROM probes ORDER BY name").fetchall()
        return [_row(row) for row in rows]

    def armed(self) -> list[ProbeRow]:
        with self._db.transaction() as db:
            rows = db.execute("SELECT * FROM probes WHERE armed = 1 ORDER BY name").fetchall()
        return [_row(row) for row in rows]

    def delete(self, name: str) -> None:
        with self._db.transaction() as db:
            if db.execute("DELETE FROM probes WHERE name = ?", (name,)).rowcount == 0:
                raise ProbeNotFound(name)

    def arm(self, name: str, armed: bool) -> ProbeRow:
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE probes SET armed = ?, updated = ? WHERE name = ?",
                (int(armed), time.time(), name),
            ).rowcount
        if changed == 0:
            raise ProbeNotFound(name)
        return self.get(name)

    # -- results -----------------------------------------------------------------

    def record(self, results: Sequence[dict[str, Any]]) -> None:
        """Append results (in order) and drop the oldest past `keep`."""
        if not results:
            return
        rows = [(r["probe"], r["request_id"], json.dumps(r, sort_keys=True)) for r in results]
        with self._db.transaction() as db:
            db.executemany(
                "INSERT INTO probe_results (probe, request_id, body) VALUES (?, ?, ?)", rows
            )
            db.execute(
                "DELETE FROM probe_results WHERE seq <= (SELECT MAX(seq) FROM probe_results) - ?",
                (self._keep,),
            )

    def results(
        self,
        *,
        after: int = 0,
        limit: int = 100,
        probe_name: str | None = None,
        request_id: str | None = None,
    ) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """Results after seq `after`, oldest first, and the seq to read after next."""
        where: list[str] = ["seq > ?"]
        args: list[object] = [after]
        if probe_name is not None:
            where.append("probe = ?")
            args.append(probe_name)
        if request_id is not None:
            where.append("request_id = ?")
            args.append(request_id)
        query = f"SELECT seq, body FROM probe_results WHERE {' AND '.join(where)} ORDER BY seq"
        with self._db.transaction() as db:
            rows = db.execute(query + " LIMIT ?", (*args, limit)).fetchall()
        page = [(int(seq), json.loads(str(body))) for seq, body in rows]
        return page, page[-1][0] if page else after
