"""OpenAI's batch object, from a kept batch and its line counts."""

from __future__ import annotations

from typing import Any

from ...store.batches import BatchRecord, Counts

WINDOW_S = {"24h": 24 * 3600}  # `completion_window` -> seconds (OpenAI takes only 24h)
STAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def expires_at(batch: BatchRecord) -> int:
    return batch.created + WINDOW_S[batch.completion_window]


def batch_object(batch: BatchRecord, counts: Counts) -> dict[str, Any]:
    """OpenAI's batch object: status, timestamps, file ids, request counts and usage."""
    errors = None if batch.errors is None else {"object": "list", "data": batch.errors}
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": batch.created,
        "expires_at": expires_at(batch),
        **{stamp: batch.stamps.get(stamp) for stamp in STAMPS},
        "request_counts": {
            "total": counts.total,
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "metadata": batch.metadata,
        "usage": {
            "input_tokens": counts.input_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens},
            "output_tokens": counts.output_tokens,
            "output_tokens_details": {"reasoning_tokens": counts.reasoning_tokens},
            "total_tokens": counts.input_tokens + counts.output_tokens,
        },
    }
