"""OpenAI's Files API (`/v1/files`, issue 50 item 1, contract 0.30.0) through the official
openai SDK: an upload as the SDK sends it (multipart/form-data, with its Authorization
header), retrieve, list, content and delete, each body read into the SDK's own types."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from openai.types import FileDeleted, FileObject

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer

pytestmark = pytest.mark.e2e

LINES = b"".join(
    json.dumps(
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": GGUF_ID, "messages": [{"role": "user", "content": f"Say {i}."}]},
        }
    ).encode()
    + b"\n"
    for i in range(3)
)


@pytest.fixture(scope="module")
def sdk(default_server: LiveServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=default_server.base_url, api_key="not-needed", max_retries=0) as client:
        yield client


def test_a_batch_input_is_uploaded_read_listed_and_deleted(sdk: OpenAI) -> None:
    """Issue 50 item 1: `files.create` (multipart, `purpose: batch`) keeps the bytes and
    answers OpenAI's file object; `retrieve`, `list` (newest first) and `content` give them
    back as uploaded; `delete` forgets the file, and a later `retrieve` is 404 `not_found`."""
    made = sdk.files.create(file=("requests.jsonl", LINES), purpose="batch")
    assert isinstance(made, FileObject) and made.id.startswith("file-")
    assert (made.bytes, made.filename, made.purpose) == (len(LINES), "requests.jsonl", "batch")
    assert made.status == "processed" and made.object == "file"
    FileObject.model_validate(made.model_dump(), strict=True)
    assert sdk.files.retrieve(made.id) == made
    other = sdk.files.create(file=("more.jsonl", LINES[:10]), purpose="batch")
    listed = [f.id for f in sdk.files.list(purpose="batch")]
    assert listed.index(other.id) < listed.index(made.id)  # newest first
    assert sdk.files.content(made.id).read() == LINES
    gone = sdk.files.delete(made.id)
    assert isinstance(gone, FileDeleted) and (gone.id, gone.deleted) == (made.id, True)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.files.retrieve(made.id)
    assert caught.value.body["code"] == "not_found"  # type: ignore[index]
    assert made.id not in [f.id for f in sdk.files.list()]
    sdk.files.delete(other.id)
