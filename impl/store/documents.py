"""A JSON document kept whole: a file in the data dir, or a row of the database.

The config (`settings.json`, local/config.py) is such a document. A server with
a PostgreSQL DSN keeps it as a row of the shared database instead, so that every
replica of a cluster on any machine reads the same config (docs/CLUSTER.md).
A file is replaced atomically (temp file, fsync, rename): a crash never leaves
half of one; a row is replaced in one transaction.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from .database import PUT_SETTING, Database, setting


class Document(Protocol):
    """Where a document is kept; `name` says where in logs."""

    name: str

    def read(self) -> str | None:
        """The document's text (None: there is none yet)."""
        ...

    def write(self, text: str) -> None: ...


class FileDocument:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)

    def read(self) -> str | None:
        try:
            return self.path.read_text("utf-8")
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        write_atomic(self.path, text.encode("utf-8"))


class RowDocument:
    """A document as the value of one `settings_kv` row."""

    def __init__(self, database: Database, key: str) -> None:
        self._db = database
        self._key = key
        self.name = f"the database's {key!r} setting"

    def read(self) -> str | None:
        with self._db.transaction() as db:
            return setting(db, self._key)

    def write(self, text: str) -> None:
        with self._db.transaction() as db:
            db.execute(PUT_SETTING, (self._key, text))


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a temp file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
