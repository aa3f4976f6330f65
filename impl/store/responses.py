"""Stored responses of `POST /v1/responses` (`store`, the default): what
`previous_response_id`, `GET /v1/responses/{id}` and its `input_items` read, across restarts.

A row holds the Response object as it was answered, the request's input items (each with
its id, for `input_items`), and the conversation the model saw before its output: the
previous response's conversation and output, then this input. A next turn continues from
the conversation and the output, so a chain is read in one row, whichever rows before it
are gone. At most `limit` rows are kept: saving one more deletes the oldest (the
RESPONSES_MAX_STORED setting, contract 0.20.0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .database import Database


class ResponseNotFound(KeyError):
    """No stored response has this id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the Response object as answered
    input_items: Sequence[dict[str, Any]]  # this request's input, each item with its id
    conversation: Sequence[dict[str, Any]]  # the items the model saw before its output
    created: float = 0.0

    def context(self) -> list[dict[str, Any]]:
        """What a next turn continues from: the conversation, then this response's output."""
        return [*self.conversation, *self.response.get("output", ())]


class ResponseStore:
    def __init__(self, database: Database, limit: int) -> None:
        self._db = database
        self._limit = limit

    def save(self, stored: StoredResponse) -> None:
        """Keep `stored` (replacing a row of its id), then drop the oldest past the limit."""
        with self._db.transaction() as db:
            db.execute("DELETE FROM responses WHERE id = ?", (stored.id,))
            db.execute(
                "INSERT INTO responses (id, created, response, input_items, conversation) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.created or time.time(),
                    _text(stored.response),
                    _text(list(stored.input_items)),
                    _text(list(stored.conversation)),
                ),
            )
            db.execute(
                "DELETE FROM responses WHERE seq NOT IN "
                "(SELECT seq FROM responses ORDER BY seq DESC LIMIT ?)",
                (self._limit,),
            )

    def get(self, response_id: str) -> StoredResponse:
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT id, created, response, input_items, conversation FROM responses "
                "WHERE id = ?",
                (response_id,),
            ).fetchone()
        if row is None:
            raise ResponseNotFound(response_id)
        return StoredResponse(
            id=row[0],
            created=float(row[1]),
            response=json.loads(row[2]),
            input_items=json.loads(row[3]),
            conversation=json.loads(row[4]),
        )

    def delete(self, response_id: str) -> None:
        with self._db.transaction() as db:
            if db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount == 0:
                raise ResponseNotFound(response_id)

    def count(self) -> int:
        with self._db.transaction() as db:
            return int(db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)
