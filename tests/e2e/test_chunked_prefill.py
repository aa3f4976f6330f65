"""Chunked prefill over real HTTP (issue 43): `miserver serve --prefill-chunk 16` on the default
GGUF, batching as started by default.

A long prompt that joins while a stream decodes is prefilled 16 tokens a step
between that stream's tokens: the stream goes on while the newcomer waits for
its first token, and both get the text they get alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer, async_sdk, live_server
from tests.openai_reference import Check

CHUNK = 16
NOTES = " ".join(f"Note {j}: the tide turns at a time of its own, number {j}." for j in range(24))
LONG = [{"role": "user", "content": f"{NOTES} Summarize the notes."}]  # about 400 tokens
STORY = [{"role": "user", "content": "Write a long story about a lighthouse."}]


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    workdir = tmp_path_factory.mktemp("e2e-chunked")
    with live_server(workdir, model=None, args=["--prefill-chunk", str(CHUNK)]) as running:
        yield running


async def text(client: AsyncOpenAI, messages: list[dict[str, Any]], tokens: int) -> str:
    reply = await client.chat.completions.create(
        model=GGUF_ID, messages=messages, max_tokens=tokens, temperature=0
    )
    return str(reply.choices[0].message.content)


async def test_a_stream_goes_on_while_a_long_prompt_joins(
    chunked: LiveServer, openai_check: Check
) -> None:
    """Issue 43 (chunked prefill, `prefill-chunk`): while a prompt of about 400 tokens is
    prefilled 16 tokens a step beside a greedy stream, the stream gets its next chunks (a
    whole-prompt prefill would hold them all behind it), and each request's text is the
    one it gets alone."""
    async with async_sdk(chunked.base_url, openai_check) as client:
        got: list[tuple[float, str]] = []
        started = asyncio.Event()

        async def stream() -> None:
            chunks = await client.chat.completions.create(
                model=GGUF_ID, messages=STORY, max_tokens=120, temperature=0, stream=True
            )
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append((time.monotonic(), chunk.choices[0].delta.content))
                    if len(got) == 3:
                        started.set()

        running = asyncio.create_task(stream())
        await started.wait()
        sent = time.monotonic()
        first: list[float] = []
        joining = await client.chat.completions.create(
            model=GGUF_ID, messages=LONG, max_tokens=8, temperature=0, stream=True
        )
        pieces = []
        async for chunk in joining:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or [time.monotonic()]
                pieces.append(chunk.choices[0].delta.content)
        await running
        alone_story, alone_long = await text(client, STORY, 120), await text(client, LONG, 8)
    between = [t for t, _ in got if sent < t < first[0]]
    # its prompt takes 20 steps or more; a stream's pieces go out at most every 0.05 s
    assert len(between) >= 5, (len(between), len(got))
    assert "".join(piece for _, piece in got) == alone_story
    assert "".join(pieces) == alone_long
