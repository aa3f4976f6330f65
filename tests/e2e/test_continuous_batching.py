"""Continuous batching over real HTTP: `miserver serve --parallel 4 --prefill-chunk 16
--ctx-size 4096` on the default GGUF.

Concurrent requests decode as rows of one batch; each keeps its own sampling,
stop strings and budget, gives the text it gives alone, and leaves the batch
without stopping the others. A seeded request runs alone, as with batching off. A long
prompt that joins while a stream decodes is prefilled 16 tokens a step between that
stream's tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer, async_sdk, live_server
from tests.events import Events, RowWatch
from tests.openai_reference import Check

ROWS = 4
WINDOW = 4096  # the context the rows share: 1024 tokens a row
CHUNK = 16  # prompt tokens a step for a prompt joining busy rows (chunked prefill, issue 43)
NOTES = " ".join(f"Note {j}: the tide turns at a time of its own, number {j}." for j in range(24))
LONG = [{"role": "user", "content": f"{NOTES} Summarize the notes."}]  # about 400 tokens
STORY = [{"role": "user", "content": "Write a long story about a lighthouse."}]
TOPICS = ["a dragon", "the moon", "a lighthouse", "a garden"]


def story(topic: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Write a long story about {topic}."}]


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The default model served with four rows decoded together."""
    workdir = tmp_path_factory.mktemp("e2e-batched")
    args = ["--parallel", str(ROWS), "--prefill-chunk", str(CHUNK), "--ctx-size", str(WINDOW)]
    with live_server(workdir, model=None, args=args) as running:
        yield running


async def chat(client: AsyncOpenAI, topic: str, **ask: Any) -> Any:
    ask.setdefault("temperature", 0)
    return await client.chat.completions.create(model=GGUF_ID, messages=story(topic), **ask)


async def leave_early(client: AsyncOpenAI, chunks: int = 3) -> int:
    """A greedy stream of a long story, closed by its client after `chunks` chunks."""
    stream = await client.chat.completions.create(
        model=GGUF_ID, messages=story("a dragon"), max_tokens=200, temperature=0, stream=True
    )
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == chunks:
            break
    await stream.close()
    return seen


async def test_greedy_rows_give_the_text_each_gives_alone(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-01, OAI-CBM-02, OAI-CBM-14: four greedy requests at once decode together (the
    health endpoint sees four slots in use on the batching backend) and each gets the text
    it gets alone."""
    async with async_sdk(batched.base_url, openai_check) as client:
        alone = [(await chat(client, t, max_tokens=48)).choices[0].message.content for t in TOPICS]
        with RowWatch(batched) as watch:
            replies = await asyncio.gather(*(chat(client, t, max_tokens=48) for t in TOPICS))
    assert [r.choices[0].message.content for r in replies] == alone
    assert watch.backend == "continuous_batching"
    assert watch.most == ROWS


async def test_each_row_keeps_its_sampling_stop_and_budget(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-02 (per-row parameters, beyond the seed's fixed ones): in one batch, a sampled
    row, a row cut by a stop string and a row cut by max_tokens each end as they asked."""
    async with async_sdk(batched.base_url, openai_check) as client:
        free = await chat(client, "the moon", max_tokens=40)
        stop = free.choices[0].message.content.split()[3]  # a word the greedy text writes
        with RowWatch(batched) as watch:
            sampled, stopped, short = await asyncio.gather(
                chat(client, "a dragon", max_tokens=40, temperature=1.3, top_p=0.9),
                chat(client, "the moon", max_tokens=40, stop=[stop]),
                chat(client, "a garden", max_tokens=5),
            )
    assert watch.most >= 2
    assert stopped.choices[0].finish_reason == "stop"
    assert stop not in stopped.choices[0].message.content
    assert free.choices[0].message.content.startswith(stopped.choices[0].message.content)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 5
    assert sampled.usage is not None and sampled.usage.completion_tokens <= 40


async def test_a_client_that_leaves_frees_its_row_and_the_others_finish(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-02: a stream closed after a few chunks leaves the batch; the rows
    beside it run to their full length, and every row is free afterwards."""
    health = batched.base_url.removesuffix("/v1") + "/api/health/inference"
    async with async_sdk(batched.base_url, openai_check) as client:
        left, *stayed = await asyncio.gather(
            leave_early(client),
            chat(client, "the moon", max_tokens=64, temperature=0),
            chat(client, "a garden", max_tokens=64, temperature=0),
        )
    assert left == 3
    assert [r.usage.completion_tokens for r in stayed] == [64, 64]
    deadline = time.monotonic() + 10
    while httpx.get(health).json()["slots_in_use"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert httpx.get(health).json()["slots_in_use"] == 0


async def test_a_seeded_request_runs_alone_and_repeats(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-08, OAI-SEED-05: a seeded request is served on the serial path (never beside a
    row), so the same seed gives the same text while other requests are decoding."""
    async with async_sdk(batched.base_url, openai_check) as client:
        first = await chat(client, "a lighthouse", max_tokens=24, temperature=1.0, seed=7)
        busy = [chat(client, t, max_tokens=32) for t in TOPICS[:2]]
        second, *_ = await asyncio.gather(
            chat(client, "a lighthouse", max_tokens=24, temperature=1.0, seed=7), *busy
        )
    assert first.choices[0].message.content == second.choices[0].message.content


async def test_a_request_too_long_for_a_row_runs_alone(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-02: each row holds its share of the window (4096 / 4 here); a prompt past it
    is served alone on the serial path, so a request that comes meanwhile waits in line."""
    long = [{"role": "user", "content": "Repeat after me: " + "apple pear " * 550}]
    async with async_sdk(batched.base_url, openai_check) as client:
        with RowWatch(batched) as watch:
            first = asyncio.create_task(
                client.chat.completions.create(
                    model=GGUF_ID, messages=long, max_tokens=8, temperature=0
                )
            )
            await asyncio.sleep(0.3)
            second = await chat(client, "the moon", max_tokens=8)
            reply = await first
    assert reply.usage is not None and reply.usage.prompt_tokens > WINDOW // ROWS
    assert second.choices[0].message.content
    assert watch.queued >= 1 and watch.most == 1


async def test_operators_see_the_batch_on_the_event_stream(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-14, LOC-EVENTS-02: while rows decode, /api/events carries `batch` events (rows,
    tokens/s, steps), at most one a second."""
    with Events(batched.base_url.removesuffix("/v1")) as listener:
        async with async_sdk(batched.base_url, openai_check) as client:
            started = time.monotonic()
            await asyncio.gather(*(chat(client, t, max_tokens=64) for t in TOPICS))
            seconds = time.monotonic() - started
        listener.wait_for(lambda _: listener.named("batch"))
    batches = listener.named("batch")
    assert set(batches[0]) == {"rows", "tok_s", "steps"}
    assert max(b["rows"] for b in batches) >= 2
    assert all(b["tok_s"] > 0 and b["steps"] >= 1 for b in batches)
    assert len(batches) <= seconds + 2


async def test_a_row_freed_by_a_client_that_left_goes_to_the_next_in_line(
    batched: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-02: with every row taken, a stream that leaves gives its row to the request
    waiting in line, which runs to its end (its sequence is freed before the newcomer is
    let in, never after)."""
    async with async_sdk(batched.base_url, openai_check) as client:

        async def later() -> Any:
            await asyncio.sleep(0.5)  # behind the four rows
            return await chat(client, "a garden", max_tokens=16)

        *_, waited = await asyncio.gather(
            leave_early(client),
            *(chat(client, t, max_tokens=96) for t in TOPICS[1:ROWS]),
            later(),
        )
    assert waited.choices[0].finish_reason == "length"
    assert waited.usage is not None and waited.usage.completion_tokens == 16


async def text(client: AsyncOpenAI, messages: list[dict[str, Any]], tokens: int) -> str:
    reply = await client.chat.completions.create(
        model=GGUF_ID, messages=messages, max_tokens=tokens, temperature=0
    )
    return str(reply.choices[0].message.content)


async def test_a_stream_goes_on_while_a_long_prompt_joins(
    batched: LiveServer, openai_check: Check
) -> None:
    """Issue 43 (chunked prefill, `prefill-chunk`): while a prompt of about 400 tokens is
    prefilled 16 tokens a step beside a greedy stream, the stream gets its next chunks (a
    whole-prompt prefill would hold them all behind it), and each request's text is the
    one it gets alone."""
    async with async_sdk(batched.base_url, openai_check) as client:
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
