"""Steering per row over real HTTP: `miserver serve --parallel 4` on each engine (the
transformers SmolLM2, and its GGUF on llama.cpp since issue 46, where rows steered
differently decode in groups, one control vector each).

Requests steered different ways decode as rows of one batch; each response's
`X-miLLM-Steering` states what its own row ran, and each text is the text the
request gets alone. Scoring sent while steered rows decode runs between their
steps, unsteered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from miserver.steering import steering_set_hash
from miserver.steering.header import InlineMember, NoneMember, parse
from tests.conftest import GGUF_ID, MODEL_ID, SAE_ID
from tests.e2e.conftest import LiveServer, async_sdk, live_server
from tests.events import RowWatch
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

ROWS = 4
HELLO: list[Any] = [{"role": "user", "content": "Tell me about your favourite place."}]
ASKS: list[list[dict[str, Any]] | None] = [
    [{"index": 5, "strength": 150.0}],
    None,
    [{"index": 9, "strength": -150.0}],
]


@pytest.fixture(scope="module", params=[MODEL_ID, GGUF_ID], ids=["transformers", "gguf"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, saes_dir: Path
) -> Iterator[LiveServer]:
    """SmolLM2 on one engine with four rows, the trained SAE attached."""
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    workdir = tmp_path_factory.mktemp("e2e-batched-steering")
    model = request.param
    with live_server(workdir, env, model=model, args=["--parallel", str(ROWS)]) as running:
        root = running.base_url.removesuffix("/v1")
        attach = httpx.post(f"{root}/api/steering/attachments", json={"sae_id": SAE_ID})
        assert attach.status_code in (200, 201), attach.text
        yield running


def model_of(server: LiveServer) -> str:
    """The model the server serves: its one entry of /v1/models that is loaded."""
    listing = httpx.get(f"{server.base_url}/models").json()["data"]
    return next(str(m["id"]) for m in listing if m.get("state") == "LOADED")


async def steered_chat(
    client: AsyncOpenAI, model: str, features: list[dict[str, Any]] | None, **ask: Any
) -> tuple[str, str]:
    """A greedy chat, steered inline by `features` (None: unsteered): its text and its
    X-miLLM-Steering."""
    extra = {} if features is None else {"steering": {"sae_id": SAE_ID, "features": features}}
    ask = {"max_tokens": 24, "temperature": 0, **ask}
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=HELLO, extra_body=extra, **ask
    )
    text = raw.parse().choices[0].message.content or ""
    return text, raw.headers["X-miLLM-Steering"]


async def test_each_row_is_steered_its_own_way_and_its_header_says_so(
    server: LiveServer, openai_check: Check
) -> None:
    """OAI-CBM-15, OAI-HDR-09, OAI-HASH-01: three requests steered three ways decode together
    (slots in use reach three); each gets the text it gets alone, and each header names its
    own row's steering: its inline set's hash, or none."""
    model = model_of(server)
    async with async_sdk(server.base_url, openai_check) as client:
        alone = [await steered_chat(client, model, features) for features in ASKS]
        with RowWatch(server) as watch:
            together = await asyncio.gather(*(steered_chat(client, model, f) for f in ASKS))
    assert watch.backend == "continuous_batching"
    assert watch.most == len(ASKS)
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert len({text for text, _ in together}) == len(ASKS)  # the steering changed each text
    for features, (_, header) in zip(ASKS, together, strict=True):
        [member] = parse(header)
        if features is None:
            assert member == NoneMember()
        else:
            assert isinstance(member, InlineMember)
            assert member.hash == steering_set_hash(SAE_ID, features)


async def test_scoring_during_a_steered_batch_is_unsteered(
    server: LiveServer, openai_check: Check
) -> None:
    """OAI-SCORE-35, OAI-SCORE-11: a scoring request sent while steered rows stream is
    answered before they end (between their steps, not after the batch) with exactly the
    log-probabilities it gets on an idle server, and `X-miLLM-Steering: none`."""
    model = model_of(server)
    score: dict[str, Any] = {
        "model": model,
        "messages": HELLO,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 5,
    }
    async with async_sdk(server.base_url, openai_check) as client:
        idle = (await client.chat.completions.create(**score)).choices[0].logprobs
        ended: list[float] = []

        async def stream(features: list[dict[str, Any]] | None) -> None:
            extra = {"steering": {"sae_id": SAE_ID, "features": features}}
            chunks = await client.chat.completions.create(
                model=model,
                messages=HELLO,
                max_tokens=120,
                temperature=0,
                stream=True,
                extra_body=extra,
            )
            async for _ in chunks:
                started.set()
            ended.append(time.monotonic())

        started = asyncio.Event()
        streams = [asyncio.create_task(stream(f)) for f in ASKS if f is not None]
        await started.wait()
        raw = await client.chat.completions.with_raw_response.create(**score)
        scored_at = time.monotonic()
        await asyncio.gather(*streams)
    assert raw.headers["X-miLLM-Steering"] == "none"
    assert raw.parse().choices[0].logprobs == idle
    assert all(scored_at < end for end in ended)
