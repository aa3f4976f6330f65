"""What both engines' batches share: an engine's rows behind the `Batch` protocol.

Each engine's `Rows` (its `batch.py`) decodes the rows; the engine's
`RowsBatch` adds `join`, which makes a request's grammar and randomness as its
serial path does. Steps and leaves only check that a row is the engine's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from .base import BatchRow

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Rows(Protocol[R_contra]):
    """An engine's rows: what `step`, `leave` and `close` reach."""

    capacity: int
    window: int

    def step(
        self, rows: Sequence[R_contra], *, decode: bool = True, cap: int | None = None
    ) -> None: ...

    def leave(self, row: R_contra) -> None: ...

    def close(self) -> None: ...


T = TypeVar("T", bound=Rows[Any])

ROW_WINDOW = 2048  # tokens: the least window a row of an automatic batch gets
MAX_ROWS = 4  # rows an automatic `parallel` decodes together at most (llama-server's 4 slots)
AUTO = 0  # `LoadOptions.parallel` for "auto": the engine's loader picks `rows_for` its window
PREFILL_CHUNK = 256  # `prefill-chunk: auto`: prompt tokens a step while other rows decode


def rows_for(window: int) -> int:
    """The rows `parallel: auto` decodes together on a `window`-token context: each keeps
    at least ROW_WINDOW tokens, at most MAX_ROWS rows (1: serial)."""
    return max(1, min(MAX_ROWS, window // ROW_WINDOW))


def parallel_of(asked: int, window: int) -> int:
    """The rows a load decodes together: `asked`, or (AUTO) `rows_for(window)`."""
    return rows_for(window) if asked == AUTO else max(1, asked)


def chunk_of(asked: int) -> int:
    """A load's prefill chunk: `asked` (0: a whole prompt a step), or (-1, auto)
    PREFILL_CHUNK."""
    return PREFILL_CHUNK if asked < 0 else asked


def prefill_limit(chunk: int, *, decoded: bool, cap: int | None = None) -> int | None:
    """How many prompt tokens of the rows not ready a step runs (None: all): `chunk` when
    rows decoded in it (0: a whole prompt), at most `cap` then, else all, for no row waits
    for them."""
    if not decoded:
        return None
    limit = chunk or None
    return cap if limit is None else limit if cap is None else min(limit, cap)


def prompt_row(prompt_ids: Sequence[int], window: int) -> list[int]:
    """A prompt's ids as a row takes them; refused when empty or longer than the window."""
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt holds no tokens")
    if len(ids) > window:
        raise ValueError(f"the prompt holds {len(ids)} tokens; the window is {window}")
    return ids


class RowsBatchBase(Generic[T, R]):
    """`Batch` less `join` and `join_all`, over `rows` (an engine's `Rows`) whose rows are
    `row_type`."""

    def __init__(self, rows: T, row_type: type[R]) -> None:
        self._rows = rows
        self._row_type = row_type

    @property
    def capacity(self) -> int:
        return self._rows.capacity

    @property
    def window(self) -> int:
        return self._rows.window

    def step(
        self, rows: Sequence[BatchRow], *, decode: bool = True, cap: int | None = None
    ) -> None:
        self._rows.step([self._own(row) for row in rows], decode=decode, cap=cap)

    def leave(self, row: BatchRow) -> None:
        self._rows.leave(self._own(row))

    def close(self) -> None:
        self._rows.close()

    def _own(self, row: BatchRow) -> R:
        if not isinstance(row, self._row_type):
            raise TypeError("the row comes from another batch")
        return row
