"""Batches of the OpenAI Batch API (`/v1/batches`, issue 50) and their lines, in SQLite.

A batch's lines are copied from its input file when it is made, so it runs on
whatever happens to that file. Each line's result (the JSONL line its output or
error file will hold) is written in one transaction when the line ends, and a
line with a result is never run again: after a `kill -9` a restart runs exactly
the lines that have none. The output files are kept in the same transaction that
makes the batch terminal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .database import Database
from .files import StoredFile, insert

ACTIVE = ("in_progress", "finalizing", "cancelling")  # what a (re)started runner goes on with
_COLUMNS = (
    "id, endpoint, input_file_id, completion_window, metadata, model, status, created, "
    "stamps, output_file_id, error_file_id, errors"
)


class BatchNotFound(KeyError):
    """No batch has this id."""


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    model: str | None
    status: str
    created: int
    stamps: dict[str, int]  # `in_progress_at`, `finalizing_at`, ... as they happened
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None  # why the batch failed, when it did

    @classmethod
    def of(cls, row: Sequence[Any]) -> BatchRecord:
        metadata = None if row[4] is None else json.loads(row[4])
        errors = None if row[11] is None else json.loads(row[11])
        return cls(
            id=row[0],
            endpoint=row[1],
            input_file_id=row[2],
            completion_window=row[3],
            metadata=metadata,
            model=row[5],
            status=row[6],
            created=row[7],
            stamps=json.loads(row[8]),
            output_file_id=row[9],
            error_file_id=row[10],
            errors=errors,
        )


@dataclass(frozen=True, slots=True)
class Counts:
    total: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class LineRecord:
    line: int  # its number in the input file, from 1
    custom_id: str | None
    request: str | None  # the body to send; None for a line refused when the batch was made
    result: str | None = None  # its output or error line, once it ended
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Tokens:
    input: int = 0
    output: int = 0
    cached: int = 0
    reasoning: int = 0


def _counted(tokens: Tokens) -> tuple[int, int, int, int]:
    return tokens.input, tokens.output, tokens.cached, tokens.reasoning


class BatchStore:
    def __init__(self, database: Database) -> None:
        self._db = database

    def add(self, batch: BatchRecord, lines: Iterable[LineRecord]) -> None:
        with self._db.transaction() as db:
            db.execute(
                f"INSERT INTO batches ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    batch.id, batch.endpoint, batch.input_file_id, batch.completion_window,
                    None if batch.metadata is None else json.dumps(batch.metadata),
                    batch.model, batch.status, batch.created, json.dumps(batch.stamps),
                    batch.output_file_id, batch.error_file_id,
                    None if batch.errors is None else json.dumps(batch.errors),
                ),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO batch_lines (batch_id, line, custom_id, request, result, failed) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (batch.id, ln.line, ln.custom_id, ln.request, ln.result, int(ln.failed))
                    for ln in lines
                ],
            )

    def get(self, batch_id: str) -> BatchRecord:
        with self._db.transaction() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise BatchNotFound(batch_id)
        return BatchRecord.of(row)

    def listed(self) -> list[BatchRecord]:
        """Every batch, oldest first."""
        with self._db.transaction() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM batches ORDER BY seq").fetchall()
        return [BatchRecord.of(row) for row in rows]

    def next_active(self) -> BatchRecord | None:
        """The oldest batch still to run or finish."""
        marks = ", ".join("?" * len(ACTIVE))
        with self._db.transaction() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE status IN ({marks}) ORDER BY seq LIMIT 1",
                ACTIVE,
            ).fetchone()
        return None if row is None else BatchRecord.of(row)

    def counts(self, batch_id: str) -> Counts:
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT COUNT(*), "
                "COALESCE(SUM(CASE WHEN result IS NOT NULL AND failed = 0 THEN 1 END), 0), "
                "COALESCE(SUM(CASE WHEN result IS NOT NULL AND failed = 1 THEN 1 END), 0), "
                "COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
                "COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(reasoning_tokens), 0) "
                "FROM batch_lines WHERE batch_id = ?",
                (batch_id,),
            ).fetchone()
        return Counts(*map(int, row))  # PostgreSQL sums as numeric

    def pending(self, batch_id: str) -> list[LineRecord]:
        """The lines still to run, in file order."""
        with self._db.transaction() as db:
            rows = db.execute(
                "SELECT line, custom_id, request FROM batch_lines "
                "WHERE batch_id = ? AND result IS NULL AND request IS NOT NULL ORDER BY line",
                (batch_id,),
            ).fetchall()
        return [LineRecord(*row) for row in rows]

    def lines(self, batch_id: str) -> list[LineRecord]:
        """Every line, in file order, with its result when it has one."""
        with self._db.transaction() as db:
            rows = db.execute(
                "SELECT line, custom_id, request, result, failed FROM batch_lines "
                "WHERE batch_id = ? ORDER BY line",
                (batch_id,),
            ).fetchall()
        return [LineRecord(row[0], row[1], row[2], row[3], bool(row[4])) for row in rows]

    def record(
        self, batch_id: str, line: int, result: str, *, failed: bool, tokens: Tokens
    ) -> bool:
        """A line's result, kept once: False when it had one already."""
        with self._db.transaction() as db:
            changed = db.execute(
                "UPDATE batch_lines SET result = ?, failed = ?, input_tokens = ?, "
                "output_tokens = ?, cached_tokens = ?, reasoning_tokens = ? "
                "WHERE batch_id = ? AND line = ? AND result IS NULL",
                (result, int(failed), *_counted(tokens), batch_id, line),
            ).rowcount
        return bool(changed)

    def close(self, batch_id: str, results: Sequence[tuple[int, str]]) -> None:
        """Failed results for the lines that never ran (cancelled, expired): `(line,
        result)`; a line with a result keeps it."""
        with self._db.transaction() as db:
            db.executemany(
                "UPDATE batch_lines SET result = ?, failed = 1 "
                "WHERE batch_id = ? AND line = ? AND result IS NULL",
                [(result, batch_id, line) for line, result in results],
            )

    def fail(self, batch_id: str, at: int, errors: list[dict[str, Any]]) -> BatchRecord:
        """The batch `failed` (a fault of the server's: a client's is refused at creation)."""
        with self._db.transaction() as db:
            db.execute("UPDATE batches SET errors = ? WHERE id = ?", (json.dumps(errors), batch_id))
            self._move(db, batch_id, "failed", "failed_at", at)
        return self.get(batch_id)

    def move(self, batch_id: str, status: str, stamp: str, at: int) -> BatchRecord:
        """`status` from now on, `stamp` (`cancelling_at`, ...) set to `at`."""
        with self._db.transaction() as db:
            self._move(db, batch_id, status, stamp, at)
        return self.get(batch_id)

    def finish(
        self,
        batch_id: str,
        status: str,
        at: int,
        output: StoredFile | None,
        errors: StoredFile | None,
    ) -> BatchRecord:
        """The batch terminal (`status`, stamped `<status>_at`), with its output and error
        files kept in the same transaction."""
        with self._db.transaction() as db:
            for made in filter(None, (output, errors)):
                insert(db, made)
            db.execute(
                "UPDATE batches SET output_file_id = ?, error_file_id = ? WHERE id = ?",
                (output and output.id, errors and errors.id, batch_id),
            )
            self._move(db, batch_id, status, f"{status}_at", at)
        return self.get(batch_id)

    @staticmethod
    def _move(db: Any, batch_id: str, status: str, stamp: str, at: int) -> None:
        row = db.execute("SELECT stamps FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise BatchNotFound(batch_id)
        stamps = json.loads(row[0]) | {stamp: at}
        db.execute(
            "UPDATE batches SET status = ?, stamps = ? WHERE id = ?",
            (status, json.dumps(stamps), batch_id),
        )
