"""The SDK's stream helpers see a streamed request's usage, once, on both engines.

`client.chat.completions.stream(...)` keeps the last chunk's `usage` and
`system_fingerprint` as the final completion's; a client that adds up every
usage it sees (LangChain's `stream_usage`) must count the request once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests import openai_reference
from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import LiveServer, checked_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

# a reply that ends by itself: the helper refuses to finish a reply cut at max_tokens
SHORT: list[Any] = [{"role": "user", "content": "Say OK."}]
MAX_TOKENS = 40
ENGINES = {"transformers": ("server", MODEL_ID), "gguf": ("default_server", GGUF_ID)}


@pytest.fixture(params=sorted(ENGINES))
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(base URL, model): `miserver serve --model SmolLM2` (transformers) or the default GGUF."""
    fixture, model = ENGINES[request.param]
    live: LiveServer = request.getfixturevalue(fixture)
    return live.base_url, model


def ask(model: str) -> dict[str, Any]:
    return {"model": model, "messages": SHORT, "max_tokens": MAX_TOKENS, "temperature": 0}


USAGE: dict[str, Any] = {"stream_options": {"include_usage": True}}


def check(final: ChatCompletion, chunks: list[ChatCompletionChunk], plain: ChatCompletion) -> None:
    assert final.usage is not None and plain.usage is not None
    assert final.usage.prompt_tokens == plain.usage.prompt_tokens
    assert 0 < final.usage.completion_tokens < MAX_TOKENS
    assert final.system_fingerprint == plain.system_fingerprint is not None
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    # what a client that sums every chunk's usage counts: the request, once
    counted = sum(c.usage.total_tokens for c in chunks if c.usage is not None)
    assert counted == final.usage.total_tokens
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1


def test_final_completion_has_usage(target: tuple[str, str], openai_check: Check) -> None:
    """OAI-STREAM-05, OAI-STREAM-08, OAI-GEN-02: the sync stream helper's final completion has
    the request's usage and fingerprint; summing the chunks' usage counts the request once."""
    base_url, model = target
    with checked_sdk(base_url, openai_check) as sdk:
        plain = sdk.chat.completions.create(**ask(model))
        with sdk.chat.completions.stream(**ask(model), **USAGE) as stream:
            chunks = [event.chunk for event in stream if event.type == "chunk"]
            final = stream.get_final_completion()
    check(final, chunks, plain)


def test_async_final_completion_has_usage(target: tuple[str, str], openai_check: Check) -> None:
    """OAI-STREAM-05, OAI-STREAM-08, OAI-GEN-02: the same with the async client."""
    base_url, model = target

    async def run() -> tuple[ChatCompletion, list[ChatCompletionChunk], ChatCompletion]:
        async with AsyncOpenAI(
            base_url=base_url,
            api_key="not-needed",
            max_retries=0,
            timeout=60.0,
            http_client=openai_reference.async_client(openai_check),
        ) as sdk:
            plain = await sdk.chat.completions.create(**ask(model))
            async with sdk.chat.completions.stream(**ask(model), **USAGE) as stream:
                chunks = [event.chunk async for event in stream if event.type == "chunk"]
                final = await stream.get_final_completion()
        return final, chunks, plain

    check(*asyncio.run(run()))
