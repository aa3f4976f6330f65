"""OpenAI's Batch API through the official openai SDK on `miserver serve` (issue 50
acceptance, contract 0.31.0): `files.create`, `batches.create`, `retrieve`, `list`, `cancel`
and `files.content`, each body read into the SDK's own types, every output body checked
against OpenAI's published schemas; and a `kill -9` mid-batch, after which a restart runs
every line exactly once."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer, live_server
from tests.openai_reference import schema_name, violations

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
CHAT_SCHEMA = str(schema_name(CHAT, 200))
DONE = ("completed", "failed", "cancelled", "expired")


def lines(count: int, max_tokens: int = 8, prefix: str = "line") -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"{prefix}-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "model": GGUF_ID,
                    "messages": [{"role": "user", "content": f"Write about the number {i}."}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                },
            }
        ).encode()
        + b"\n"
        for i in range(count)
    )


@pytest.fixture(scope="module")
def sdk(default_server: LiveServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=default_server.base_url, api_key="not-needed", max_retries=0) as client:
        yield client


def finished(sdk: OpenAI, batch_id: str, timeout: float = 300.0) -> Batch:
    deadline = time.monotonic() + timeout
    while (batch := sdk.batches.retrieve(batch_id)).status not in DONE:
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def read(sdk: OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    found = [json.loads(raw) for raw in sdk.files.content(file_id).read().splitlines()]
    return {line["custom_id"]: line for line in found}


def test_a_batch_through_the_sdk(sdk: OpenAI) -> None:
    """Issue 50 acceptance: the SDK uploads a JSONL file, makes a batch, polls it with
    `retrieve` until `completed` (its object valid as the SDK's `Batch`, strictly), finds
    it in `list`, and reads the output file with `files.content`: one line per request,
    each a 200 whose body is a chat completion valid against OpenAI's published schema."""
    upload = sdk.files.create(file=("requests.jsonl", lines(5)), purpose="batch")
    made = sdk.batches.create(
        input_file_id=upload.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"run": "sdk"},
    )
    assert made.status == "in_progress" and made.metadata == {"run": "sdk"}
    assert made.request_counts is not None and made.request_counts.total == 5
    batch = finished(sdk, made.id)
    Batch.model_validate(batch.model_dump(), strict=True)
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 0)
    assert batch.completed_at is not None and batch.finalizing_at is not None
    assert batch.error_file_id is None and batch.output_file_id is not None
    assert sdk.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert made.id in [b.id for b in sdk.batches.list()]
    out = read(sdk, batch.output_file_id)
    assert list(out) == [f"line-{i}" for i in range(5)]
    for line in out.values():
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert violations(CHAT_SCHEMA, line["response"]["body"]) == []
        assert line["response"]["millm"]["headers"]["x-millm-steering"] == "none"
    with pytest.raises(openai.ConflictError):
        sdk.batches.cancel(made.id)


def test_cancel_through_the_sdk(sdk: OpenAI) -> None:
    """Issue 50: `batches.cancel` on a running batch answers it `cancelling`; it ends
    `cancelled` with every line accounted for once: run (output file) or not
    (`batch_cancelled` in the error file)."""
    upload = sdk.files.create(file=("many.jsonl", lines(40, max_tokens=32)), purpose="batch")
    made = sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    cancelling = sdk.batches.cancel(made.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    batch = finished(sdk, made.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    out, errors = read(sdk, batch.output_file_id), read(sdk, batch.error_file_id)
    assert sorted(out.keys() | errors.keys()) == sorted(f"line-{i}" for i in range(40))
    assert not out.keys() & errors.keys() and len(errors) > 0
    assert {e["error"]["code"] for e in errors.values()} == {"batch_cancelled"}
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(out), len(errors))


def test_a_batch_survives_kill_9(tmp_path: Path) -> None:
    """Issue 50 acceptance: `kill -9` mid-batch and a restart on the same data dir: the
    batch goes on where it stopped and ends with every line done exactly once. The lines
    kept before the kill keep their results (their request ids, read from the database
    the killed server left), so none ran twice; none is missing."""
    count = 24
    with live_server(tmp_path, model=None) as first:
        with OpenAI(base_url=first.base_url, api_key="none", max_retries=0) as sdk:
            upload = sdk.files.create(file=("in.jsonl", lines(count, 24)), purpose="batch")
            made = sdk.batches.create(
                input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
            )
            deadline = time.monotonic() + 240
            while (counts := sdk.batches.retrieve(made.id).request_counts) is None or (
                counts.completed < 4
            ):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
    with sqlite3.connect(tmp_path / "data" / "miserver.sqlite3") as db:
        kept = dict(
            db.execute("SELECT custom_id, result FROM batch_lines WHERE result IS NOT NULL")
        )
    assert 4 <= len(kept) < count  # killed mid-batch
    with (
        live_server(tmp_path, model=None) as second,
        OpenAI(base_url=second.base_url, api_key="none", max_retries=0) as sdk,
    ):
        batch = finished(sdk, made.id)
        out = read(sdk, batch.output_file_id)
    assert batch.status == "completed" and batch.error_file_id is None
    assert sorted(out) == sorted(f"line-{i}" for i in range(count))
    for custom_id, result in kept.items():
        assert out[custom_id] == json.loads(result)  # kept, never run again
    assert len({line["response"]["request_id"] for line in out.values()}) == count
