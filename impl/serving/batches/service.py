"""The Batch API's rules (`/v1/batches`, issue 50; contract 0.31.0) over the batch store.

A batch is made from an uploaded file of purpose `batch`: its lines are read
and validated one by one there and then (serving/batches/lines.py), so the new
batch is `in_progress` at once (OpenAI's `validating` lasts no time here) and
a bad line is already an error line. What refuses the batch itself names its
field: an unknown input file (404 `input_file_id`), a file of another purpose,
one with no line or too many (400), metadata over OpenAI's limits (400
`metadata`). Cancelling is for a batch in progress (409 `conflict` otherwise).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from ...errors import ApiError, InvalidParameter
from ...events import EventBus
from ...store.batches import BatchNotFound, BatchRecord, BatchStore, LineRecord
from ..files import UPLOADED, FileService
from ..paging import page
from . import lines
from .objects import batch_object
from .runner import BatchRunner

EVENT = "batch_job"  # on /api/events: a batch's object, on each change and as lines end
METADATA_KEYS, KEY_CHARS, VALUE_CHARS = 16, 64, 512  # OpenAI's metadata limits


class BatchService:
    def __init__(
        self, store: BatchStore, files: FileService, refusal: lines.Refusal, bus: EventBus
    ) -> None:
        self.store = store
        self._files = files
        self._refusal = refusal  # the refusal a line's model name gets (OAI-GGUF-08)
        self._bus = bus
        self.runner: BatchRunner | None = None  # bound by the app, which holds the ASGI stack

    def create(
        self,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: Mapping[str, str] | None,
    ) -> dict[str, Any]:
        _check_metadata(metadata)
        source = self._files.found(input_file_id, param="input_file_id")
        if source.purpose != UPLOADED:
            raise InvalidParameter(
                "input_file_id",
                f"The file `{input_file_id}` has the purpose `{source.purpose}`; a batch's "
                f"input is uploaded with `{UPLOADED}`.",
            )
        read = lines.read(self._files.content(input_file_id), endpoint, self._refusal)
        now = int(time.time())
        batch = BatchRecord(
            id=f"batch_{secrets.token_hex(12)}",
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            metadata=None if metadata is None else dict(metadata),
            model=_model(read),
            status="in_progress",
            created=now,
            stamps={"in_progress_at": now},
        )
        self.store.add(batch, read)
        self.announce(batch.id)
        if self.runner is not None:
            self.runner.wake()
        return self.found(batch.id)

    def found(self, batch_id: str) -> dict[str, Any]:
        try:
            batch = self.store.get(batch_id)
        except BatchNotFound:
            raise ApiError("not_found", f"No batch has the id `{batch_id}`.", "batch_id") from None
        return batch_object(batch, self.store.counts(batch_id))

    def listed(self, *, limit: int, after: str | None) -> dict[str, Any]:
        """OpenAI's page of batches, newest first."""
        views = [batch_object(b, self.store.counts(b.id)) for b in self.store.listed()]
        return page(views, limit=limit, order="desc", after=after)

    def cancel(self, batch_id: str) -> dict[str, Any]:
        status = self.found(batch_id)["status"]
        if status != "in_progress":
            raise ApiError(
                "conflict",
                f"The batch `{batch_id}` is {status}: only a batch in progress can be cancelled.",
                "batch_id",
            )
        self.store.move(batch_id, "cancelling", "cancelling_at", int(time.time()))
        self.announce(batch_id)
        if self.runner is not None:
            self.runner.wake()
        return self.found(batch_id)

    def announce(self, batch_id: str) -> None:
        """The batch's object on /api/events."""
        self._bus.publish(EVENT, self.found(batch_id))


def _check_metadata(metadata: Mapping[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise InvalidParameter(
            "metadata", f"`metadata` holds {len(metadata)} keys; at most {METADATA_KEYS}."
        )
    for key, value in metadata.items():
        if len(key) > KEY_CHARS or not isinstance(value, str) or len(value) > VALUE_CHARS:
            raise InvalidParameter(
                "metadata",
                f"`metadata` keys are at most {KEY_CHARS} characters and values strings of at "
                f"most {VALUE_CHARS} ({key[:KEY_CHARS]!r} is not).",
            )


def _model(read: list[LineRecord]) -> str | None:
    """The model the batch's first line to run names (OpenAI's batch `model`)."""
    for line in read:
        if line.request is not None:
            model = json.loads(line.request).get("model")
            return model if isinstance(model, str) else None
    return None
