"""Files of the OpenAI Files API (`/v1/files`, issue 50): a batch's input and its output.

A file's bytes live in the data dir (`files/<id>`), written to a temporary name, flushed
to disk and renamed, so a file is whole or absent whatever ends the process; its row
(id, name, purpose, size, creation time) is inserted after the rename and deleted before
the bytes, so a listed file can always be read. An upload over `limit` bytes is refused
before anything is written. Ids are OpenAI's shape, `file-` and 24 hex digits.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .database import Connection, Database

PURPOSES = ("batch", "batch_output")  # uploaded inputs; outputs and error files made here


class FileNotFound(KeyError):
    """No file has this id."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    bytes: int
    created: int

    def view(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


def insert(db: Connection, stored: StoredFile) -> None:
    """`stored`'s row, in the caller's transaction (its bytes are on disk already)."""
    db.execute(
        "INSERT INTO files (id, filename, purpose, bytes, created) VALUES (?, ?, ?, ?, ?)",
        (stored.id, stored.filename, stored.purpose, stored.bytes, stored.created),
    )


class FileStore:
    def __init__(self, database: Database, folder: Path, limit: int) -> None:
        self._db = database
        self._folder = folder
        self.limit = limit

    def add(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        """Keep `content` as a new file; the caller checked its size against `limit`."""
        stored = StoredFile(
            id=f"file-{secrets.token_hex(12)}",
            filename=filename,
            purpose=purpose,
            bytes=len(content),
            created=int(time.time()),
        )
        self._write(stored.id, content)
        with self._db.transaction() as db:
            insert(db, stored)
        return stored

    def written(self, file_id: str, filename: str, purpose: str, content: bytes) -> StoredFile:
        """`content` on disk as `file_id` (replacing what an earlier try left there), its row
        not yet kept: the caller `insert`s it in the transaction that refers to it (a batch's
        output, made under an id its batch fixes, so a retry after a crash writes the same)."""
        self._write(file_id, content)
        return StoredFile(file_id, filename, purpose, len(content), int(time.time()))

    def get(self, file_id: str) -> StoredFile:
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT id, filename, purpose, bytes, created FROM files WHERE id = ?", (file_id,)
            ).fetchone()
        if row is None:
            raise FileNotFound(file_id)
        return StoredFile(*row)

    def content(self, file_id: str) -> bytes:
        self.get(file_id)
        return self._path(file_id).read_bytes()

    def listed(self, purpose: str | None = None) -> list[StoredFile]:
        """Every file (of `purpose`, when given), oldest first."""
        query = "SELECT id, filename, purpose, bytes, created FROM files"
        args: tuple[str, ...] = ()
        if purpose is not None:
            query, args = query + " WHERE purpose = ?", (purpose,)
        with self._db.transaction() as db:
            rows = db.execute(query + " ORDER BY seq", args).fetchall()
        return [StoredFile(*row) for row in rows]

    def delete(self, file_id: str) -> None:
        with self._db.transaction() as db:
            gone = db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        if not gone:
            raise FileNotFound(file_id)
        self._path(file_id).unlink(missing_ok=True)

    def _path(self, file_id: str) -> Path:
        return self._folder / file_id

    def _write(self, file_id: str, content: bytes) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        temporary = self._folder / f".{file_id}.part"
        with temporary.open("wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self._path(file_id))
