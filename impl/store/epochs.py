"""A cluster's epoch and its session's model, kept in the shared database (miserver.cluster).

The epoch counts the operator's changes made through the cluster (control.py);
it is stored so that a restarted control goes on from where it was. The
session record is the last `POST /api/session/load` or `unload` that succeeded:
a replica that catches up runs it too, so every replica serves the same model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .database import PUT_SETTING, Database, setting

EPOCH = "cluster_epoch"
SESSION = "cluster_session"
MOVE = (
    "INSERT INTO settings_kv (key, value) VALUES (?, '1') ON CONFLICT (key) DO UPDATE "
    "SET value = CAST(CAST(settings_kv.value AS INTEGER) + 1 AS TEXT)"
)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    epoch: int  # the epoch the change moved the cluster to
    path: str
    body: bytes


class EpochStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def epoch(self) -> int:
        with self._db.transaction() as db:
            value = setting(db, EPOCH)
        return 0 if value is None else int(value)

    def moved(self, session: tuple[str, bytes] | None = None) -> int:
        """The epoch moved by one and stored, with the session's change when it was one."""
        with self._db.transaction() as db:
            db.execute(MOVE, (EPOCH,))  # in one statement: two controls never take one epoch
            moved = setting(db, EPOCH)
            assert moved is not None  # MOVE made the row
            epoch = int(moved)
            if session is not None:
                path, body = session
                record = {"epoch": epoch, "path": path, "body": body.decode("utf-8")}
                db.execute(PUT_SETTING, (SESSION, json.dumps(record)))
        return epoch

    def session(self) -> SessionRecord | None:
        with self._db.transaction() as db:
            value = setting(db, SESSION)
        if value is None:
            return None
        record = json.loads(value)
        return SessionRecord(int(record["epoch"]), str(record["path"]), record["body"].encode())
