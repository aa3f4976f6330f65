"""A forward pass that runs its device out of memory (issue 48; REQ-000 OAI-ERR-28, OAI-ERR-29,
OAI-SCORE-31), on the real SmolLM2 on transformers in process.

No card can be filled on this machine, so a forward hook on the first decoder layer raises
torch's own `OutOfMemoryError` with the message CUDA gives; the server's handling of it is
the code a GPU runs. The hook is removed after each test and the server serves again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from tests.conftest import MODEL_ID
from tests.events import data_of

pytestmark = pytest.mark.model

CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free."
)


def _raise(*_: Any) -> None:
    raise torch.OutOfMemoryError(CUDA_MESSAGE)


@pytest.fixture
def full(client: TestClient) -> Iterator[TestClient]:
    """The session's server with its first layer running out of memory at every pass."""
    assert (
        client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 1,
            },
        ).status_code
        == 200
    )  # loaded
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    handle = engine.model.model.layers[0].register_forward_hook(_raise)
    try:
        yield client
    finally:
        handle.remove()


def _chat(**extra: Any) -> dict[str, Any]:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Count to ten."}]}
    return {**body, "max_tokens": 8, "temperature": 0, **extra}


def _is_insufficient_memory(error: dict[str, Any]) -> None:
    assert error["code"] == "insufficient_memory", error
    assert error["type"] == "invalid_request_error"
    assert "GPU 0" in error["message"]  # the card is named


def test_a_generation_that_runs_out_is_503_insufficient_memory(full: TestClient) -> None:
    """OAI-ERR-28: a JSON generation answers 503 `insufficient_memory`, naming the card."""
    response = full.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 503, response.text
    _is_insufficient_memory(response.json()["error"])


def test_a_stream_that_runs_out_ends_with_the_error_event(full: TestClient) -> None:
    """OAI-ERR-29: a stream ends with an `insufficient_memory` error event, then `[DONE]`."""
    with full.stream("POST", "/v1/chat/completions", json=_chat(stream=True)) as response:
        events = data_of(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    _is_insufficient_memory(events[-2]["error"])


def test_scoring_that_runs_out_is_the_same_refusal(full: TestClient) -> None:
    """OAI-SCORE-31: next-token scoring that runs out gives the same typed error."""
    body = {"model": MODEL_ID, "prompt": "The sky is", "max_tokens": 1, "logprobs": 5}
    response = full.post("/v1/completions", json=body)
    assert response.status_code == 503, response.text
    _is_insufficient_memory(response.json()["error"])


def test_the_server_serves_again_once_memory_is_back(client: TestClient) -> None:
    """Nothing is left torn: with the hook gone the same request is answered."""
    response = client.post("/v1/chat/completions", json=_chat())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
