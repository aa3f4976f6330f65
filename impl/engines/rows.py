"""What both engines' batches share: an engine's rows behind the `Batch` protocol.

Each engine's `Rows` (its `batch.py`) decodes the rows; the engine's
`RowsBatch` adds `join`, which makes a request's grammar and randomness as its
serial path does. Steps and leaves only check that a row is the engine's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from .base import BatchRow

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Rows(Protocol[R_contra]):
    """An engine's rows: what `step`, `leave` and `close` reach."""

    capacity: int
    window: int

    def step(self, rows: Sequence[R_contra]) -> None: ...

    def leave(self, row: R_contra) -> None: ...

    def close(self) -> None: ...


class RowsBatchBase(Generic[R]):
    """`Batch` less `join`, over `rows` whose rows are `row_type`."""

    def __init__(self, rows: Rows[R], row_type: type[R]) -> None:
        self._base_rows = rows
        self._row_type = row_type

    @property
    def capacity(self) -> int:
        return self._base_rows.capacity

    @property
    def window(self) -> int:
        return self._base_rows.window

    def step(self, rows: Sequence[BatchRow]) -> None:
        self._base_rows.step([self._own(row) for row in rows])

    def leave(self, row: BatchRow) -> None:
        self._base_rows.leave(self._own(row))

    def close(self) -> None:
        self._base_rows.close()

    def _own(self, row: BatchRow) -> R:
        if not isinstance(row, self._row_type):
            raise TypeError("the row comes from another batch")
        return row
