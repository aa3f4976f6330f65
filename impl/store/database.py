"""The server's SQLite database (DECISIONS: stdlib sqlite3, WAL mode, in the data dir).

One connection per database, shared by threads under a lock; schema changes
are numbered migrations applied once, in order, recorded in `user_version`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

MIGRATIONS: Sequence[str] = (
    """
    CREATE TABLE profiles (
        name        TEXT PRIMARY KEY,
        sae_id      TEXT NOT NULL,
        layer       INTEGER NOT NULL,
        features    TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        created     REAL NOT NULL,
        updated     REAL NOT NULL
    );
    CREATE TABLE settings_kv (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    """,
    """
    ALTER TABLE profiles ADD COLUMN intensity REAL NOT NULL DEFAULT 1.0;
    ALTER TABLE profiles ADD COLUMN intensity_range TEXT;
    CREATE TABLE attachments (
        model_id TEXT NOT NULL,
        sae_id   TEXT NOT NULL,
        layer    INTEGER NOT NULL,
        manual   TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (model_id, sae_id, layer)
    );
    """,
    """
    CREATE TABLE probes (
        name       TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        weight     BLOB NOT NULL,
        armed      INTEGER NOT NULL DEFAULT 0,
        created    REAL NOT NULL,
        updated    REAL NOT NULL
    );
    CREATE TABLE probe_results (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        probe      TEXT NOT NULL,
        request_id TEXT NOT NULL,
        body       TEXT NOT NULL
    );
    CREATE INDEX probe_results_request ON probe_results (request_id);
    """,
    """
    CREATE TABLE circuits (
        id        TEXT PRIMARY KEY,
        document  TEXT NOT NULL,
        intensity REAL NOT NULL,
        active    INTEGER NOT NULL DEFAULT 0,
        created   REAL NOT NULL,
        updated   REAL NOT NULL
    );
    """,
    """
    CREATE TABLE responses (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        id           TEXT NOT NULL UNIQUE,
        created      REAL NOT NULL,
        response     TEXT NOT NULL,
        input_items  TEXT NOT NULL,
        conversation TEXT NOT NULL
    );
    """,
    """
    CREATE TABLE files (
        seq      INTEGER PRIMARY KEY AUTOINCREMENT,
        id       TEXT NOT NULL UNIQUE,
        filename TEXT NOT NULL,
        purpose  TEXT NOT NULL,
        bytes    INTEGER NOT NULL,
        created  INTEGER NOT NULL
    );
    """,
    """
    CREATE TABLE batches (
        seq               INTEGER PRIMARY KEY AUTOINCREMENT,
        id                TEXT NOT NULL UNIQUE,
        endpoint          TEXT NOT NULL,
        input_file_id     TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        metadata          TEXT,
        model             TEXT,
        status            TEXT NOT NULL,
        created           INTEGER NOT NULL,
        stamps            TEXT NOT NULL,
        output_file_id    TEXT,
        error_file_id     TEXT,
        errors            TEXT
    );
    CREATE TABLE batch_lines (
        batch_id      TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
        line          INTEGER NOT NULL,
        custom_id     TEXT,
        request       TEXT,
        result        TEXT,
        failed        INTEGER NOT NULL DEFAULT 0,
        input_tokens  INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        reasoning_tokens INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (batch_id, line)
    );
    """,
)


class Database:
    """A migrated SQLite file; `transaction()` is the only way to touch it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        with self.transaction() as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={number}")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside BEGIN IMMEDIATE ... COMMIT (ROLLBACK on any error)."""
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield self._connection
            except BaseException:
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._connection.close()
