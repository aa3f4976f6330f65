"""The model lock for steering work (OAI-MODELS-05, issue 19 item 5).

An operator locks the server to one model (`PUT /api/steering/lock`): `/v1/models`
then lists only it, so OpenAI clients see one stable model id, and a request
or a load naming any other model is refused with `409 model_locked` naming the
lock, before anything loads. The lock is a row of the database's settings, so
it survives a restart; `DELETE /api/steering/lock` lifts it.
"""

from __future__ import annotations

import threading

from ..errors import ApiError
from ..store.database import PUT_SETTING, Database, setting

KEY = "model_lock"


class ModelLock:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._guard = threading.Lock()
        self._model: str | None = None
        self.reload()

    def reload(self) -> None:
        """The lock read from the database (at start, and where another process of a cluster
        changed it)."""
        with self._db.transaction() as db:
            self._model = setting(db, KEY)

    @property
    def model(self) -> str | None:
        """The model the server is locked to (None: not locked)."""
        return self._model

    def set(self, model: str | None) -> None:
        """Lock to `model` (a registry id), or lift the lock (None); stored at once."""
        with self._guard, self._db.transaction() as db:
            if model is None:
                db.execute("DELETE FROM settings_kv WHERE key = ?", (KEY,))
            else:
                db.execute(PUT_SETTING, (KEY, model))
            self._model = model

    def check(self, model_id: str, param: str = "model") -> None:
        """409 model_locked when the server is locked to another model than `model_id`."""
        locked = self._model
        if locked is not None and model_id != locked:
            raise ApiError(
                "model_locked",
                f"The server is locked to `{locked}` for steering work; `{model_id}` cannot be "
                "served or loaded until the lock is lifted (DELETE /api/steering/lock).",
                param,
            )

    def allows(self, model_id: str) -> bool:
        return self._model is None or model_id == self._model
