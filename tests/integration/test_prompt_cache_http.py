"""The prompt cache through the server as it starts by default (issue 43): batching on
(`parallel: auto`, 4 rows) and `cache-ram: auto`. A chat seen before is restored after 20
other chats pushed its KV out of every row, and says so in
`usage.prompt_tokens_details.cached_tokens` and in `GET /api/health/inference`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import GGUF_ID, LocalClient
from tests.local_api import load

pytestmark = pytest.mark.model

SYSTEM = "You answer questions about ancient history for a museum's visitors. " * 8


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        load(client, GGUF_ID)
        yield client


def chat(client: TestClient, system: str, question: str) -> dict[str, Any]:
    body = {
        "model": GGUF_ID,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
        "temperature": 0,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return cast(dict[str, Any], response.json())


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_chat_is_restored_after_twenty_others(client: TestClient) -> None:
    """Issue 43: the first chat prefills cold; 20 chats on other subjects go through the
    batch's rows; the first again finds all but its last token cached (restored from host
    memory: no row held it any more), and the health route counts the hit and the bytes
    the cache holds."""
    first = chat(client, SYSTEM, "Who founded Rome?")
    assert cached(first) < 16  # at most the template's head
    for k in range(20):
        chat(client, f"You are assistant number {k}, terse and exact.", f"What is {k} + {k}?")
    again = chat(client, SYSTEM, "Who founded Rome?")
    assert cached(again) == again["usage"]["prompt_tokens"] - 1
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    stats = client.get("/api/health/inference").json()["prompt_cache"]
    assert stats["hits"] >= 1 and stats["tokens_restored"] >= cached(again) - 16
    assert 0 < stats["bytes"] <= stats["budget_bytes"]
