"""A stream's text, paced (docs/DECISIONS.md, "A stream's text, paced"; docs/SETTINGS.md,
STREAM_INTERVAL_SECONDS), over real HTTP with the official SDK, on the default GGUF.

With `--stream-interval 5` a 64-token reply (well under 5 s on llama.cpp) arrives in two
content chunks: the first token's text at once, then the rest with the end. With
`--stream-interval 0` each token's text comes alone. Either way the text is the JSON
reply's and the usage the same; the batch (`--parallel 2`) paces as the serial path does.
OAI-STREAM-01, OAI-STREAM-03, OAI-STREAM-05.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import GGUF_ID, TIMING
from tests.e2e.conftest import LiveServer, checked_sdk, live_server
from tests.openai_reference import Check

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(TIMING)]

STORY: list[Any] = [{"role": "user", "content": "Write a long story about a dragon."}]
TOKENS = 64
SERVERS = {
    "paced": ["--stream-interval", "5"],
    "paced-batch": ["--stream-interval", "5", "--parallel", "2"],
    "every-token": ["--stream-interval", "0"],
}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, LiveServer]]:
    """(its name in SERVERS, the server): `miserver serve` on the default model, with that
    stream interval."""
    name: str = request.param
    workdir = tmp_path_factory.mktemp(f"e2e-pace-{name}")
    with live_server(workdir, model=None, args=SERVERS[name]) as running:
        yield name, running


def test_a_stream_sends_the_json_text_in_paced_chunks(
    served: tuple[str, LiveServer], openai_check: Check
) -> None:
    """The streamed text and usage are the JSON reply's; paced, it comes in two content
    chunks, the first long before the end; unpaced, about one per token."""
    name, server = served
    ask: dict[str, Any] = {
        "model": GGUF_ID,
        "messages": STORY,
        "max_tokens": TOKENS,
        "temperature": 0,
    }
    with checked_sdk(server.base_url, openai_check) as sdk:
        plain = sdk.chat.completions.create(**ask)
        started = time.perf_counter()
        pieces: list[tuple[float, str]] = []
        usage = None
        stream = sdk.chat.completions.create(
            **ask, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append((time.perf_counter() - started, chunk.choices[0].delta.content))
            if chunk.usage is not None:
                usage = chunk.usage
        ended = time.perf_counter() - started
    assert plain.usage is not None and usage is not None
    assert usage.completion_tokens == plain.usage.completion_tokens == TOKENS
    assert "".join(text for _, text in pieces) == plain.choices[0].message.content
    if name == "every-token":
        assert len(pieces) >= TOKENS - 4, [text for _, text in pieces]
    else:
        assert len(pieces) == 2, [text for _, text in pieces]
        first_at = pieces[0][0]
        assert first_at < ended / 2, (first_at, ended)
