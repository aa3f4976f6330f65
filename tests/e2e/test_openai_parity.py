"""The official `openai` SDK against `miserver serve`, on both engines, with every body it
receives checked against OpenAI's own published schemas (tests/openai_reference.py).

Each test runs twice: on the default server (SmolLM2's GGUF on llama.cpp) and on a
server whose model is the same weights' transformers conversion. The SDK's
httpx client is the validating one (`openai_check`, tests/e2e/conftest.py), so a
response or stream chunk that departs from OpenAI's schema fails the test even
where the SDK would have parsed it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests import openai_reference
from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import LiveServer, async_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

HELLO: list[Any] = [{"role": "user", "content": "Say hello."}]
ROOM = 64
"""Enough for SmolLM2's greedy hello to end by itself: the SDK's stream helper refuses to
build a final completion from a reply cut by `max_tokens` (LengthFinishReasonError)."""
WIDTH = 576


@dataclass(frozen=True, slots=True)
class Target:
    """One engine's server as the SDK sees it."""

    engine: str
    model: str
    base_url: str


@pytest.fixture(scope="module", params=["llama.cpp", "transformers"])
def target(request: pytest.FixtureRequest) -> Target:
    """The default server (GGUF) and the transformers server, in turn."""
    if request.param == "llama.cpp":
        gguf: LiveServer = request.getfixturevalue("default_server")
        return Target("llama.cpp", GGUF_ID, gguf.base_url)
    hf: LiveServer = request.getfixturevalue("server")
    return Target("transformers", MODEL_ID, hf.base_url)


@pytest.fixture(scope="module")
def sdk(target: Target, openai_check: Check) -> Iterator[OpenAI]:
    """The SDK as a user points it at miserver (no retries), on the validating client."""
    http = openai_reference.client(openai_check)
    with OpenAI(
        base_url=target.base_url, api_key="not-needed", max_retries=0, http_client=http
    ) as client:
        yield client


def test_chat_and_its_raw_response(sdk: OpenAI, target: Target) -> None:
    """OAI-INTEG-04, OAI-RESP-01..07, OAI-RESP-11: a chat through `with_raw_response`
    carries `x-request-id` (which the SDK reads into `_request_id`) and parses whole."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=target.model, messages=HELLO, max_tokens=12, temperature=0
    )
    assert raw.status_code == 200
    request_id = raw.headers.get("x-request-id")
    assert request_id, dict(raw.headers)
    assert raw.headers["X-miLLM-Model"] == target.model
    reply = raw.parse()
    assert reply._request_id == request_id
    assert reply.object == "chat.completion" and reply.model == target.model
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert reply.choices[0].message.refusal is None
    assert reply.usage is not None
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.system_fingerprint is not None
    assert reply.system_fingerprint.endswith(f":{target.engine}")


def test_stream_helper_final_completion_has_usage(sdk: OpenAI, target: Target) -> None:
    """OAI-STREAM-01..05, OAI-STREAM-10, OAI-INTEG-04: the SDK's `.stream()` helper
    assembles the same text as the plain call, and its final completion carries usage."""
    plain = sdk.chat.completions.create(
        model=target.model, messages=HELLO, max_tokens=ROOM, temperature=0
    )
    with sdk.chat.completions.stream(
        model=target.model,
        messages=HELLO,
        max_tokens=ROOM,
        temperature=0,
        stream_options={"include_usage": True},
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == final.choices[0].message.content == plain.choices[0].message.content
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    assert final.usage is not None
    assert final.usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    assert final.usage.prompt_tokens == plain.usage.prompt_tokens  # type: ignore[union-attr]


def test_raw_stream_ends_with_one_usage_chunk(
    sdk: OpenAI, target: Target, openai_check: Check
) -> None:
    """OAI-STREAM-02, OAI-STREAM-05, OAI-STREAM-08, OAI-STREAM-10: usage comes once, on the
    last chunk (`choices: []`), with `x-request-id` on the stream's response; every chunk
    the SDK parsed was one the schema check saw."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=target.model,
        messages=HELLO,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers.get("x-request-id")
    chunks = list(raw.parse())
    with_usage = [i for i, chunk in enumerate(chunks) if chunk.usage is not None]
    assert with_usage == [len(chunks) - 1], [c.model_dump(exclude_unset=True) for c in chunks]
    assert chunks[-1].choices == []
    assert chunks[0].choices and chunks[0].choices[0].delta.role == "assistant"
    checked = [r for r in openai_check.received if r.event]
    assert [r.body["id"] for r in checked] == [chunk.id for chunk in chunks]
    assert {r.schema for r in checked} == {"CreateChatCompletionStreamResponse"}


def test_completions(sdk: OpenAI, target: Target) -> None:
    """OAI-CMPL-01, OAI-CMPL-06, OAI-STREAM-05: a text completion, whole and streamed with
    usage on its last chunk."""
    reply = sdk.completions.create(
        model=target.model, prompt="One, two, three,", max_tokens=6, temperature=0
    )
    assert reply.object == "text_completion" and reply.choices[0].text
    chunks = list(
        sdk.completions.create(
            model=target.model,
            prompt="One, two, three,",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reply.choices[0].text
    usage, whole = chunks[-1].usage, reply.usage
    assert usage is not None and whole is not None and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.prompt_tokens,
        whole.completion_tokens,
    )  # cached_tokens differ: the second request finds the first one's prefix


def test_embeddings(sdk: OpenAI, target: Target) -> None:
    """OAI-EMB-01, OAI-EMB-03, OAI-EMB-04: floats, and the SDK's default base64, validate."""
    floats = sdk.embeddings.create(model=target.model, input=["a", "b"], encoding_format="float")
    assert [len(item.embedding) for item in floats.data] == [WIDTH, WIDTH]
    decoded = sdk.embeddings.create(model=target.model, input=["a", "b"])
    assert [len(item.embedding) for item in decoded.data] == [WIDTH, WIDTH]


def test_models(sdk: OpenAI, target: Target) -> None:
    """OAI-MODELS-01, OAI-MODELS-02, OAI-MODELS-07: the list and one model."""
    assert target.model in {m.id for m in sdk.models.list().data}
    model = sdk.models.retrieve(target.model)
    assert model.id == target.model and model.object == "model"


def test_errors(sdk: OpenAI, target: Target) -> None:
    """OAI-ERR-01, OAI-ERR-03, OAI-SEED-02: refusals raise the SDK's own exceptions, with
    the code and the field named."""
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=4)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=target.model, messages=HELLO, max_tokens=4, seed=-1)
    assert bad.value.param == "seed"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")


async def test_async_client(target: Target, openai_check: Check) -> None:
    """OAI-INTEG-04, OAI-STREAM-05, OAI-ERR-01: the AsyncOpenAI client: chat, stream helper
    with usage, completion, embeddings, models and a refusal."""
    async with async_sdk(target.base_url, openai_check) as sdk:
        reply = await sdk.chat.completions.create(
            model=target.model, messages=HELLO, max_tokens=ROOM, temperature=0
        )
        assert reply.choices[0].message.content
        async with sdk.chat.completions.stream(
            model=target.model,
            messages=HELLO,
            max_tokens=ROOM,
            temperature=0,
            stream_options={"include_usage": True},
        ) as stream:
            final = await stream.get_final_completion()
        assert final.choices[0].message.content == reply.choices[0].message.content
        assert final.usage is not None
        completion = await sdk.completions.create(
            model=target.model, prompt="One, two,", max_tokens=4, temperature=0
        )
        assert completion.choices[0].text
        vectors = await sdk.embeddings.create(model=target.model, input="a")
        assert len(vectors.data[0].embedding) == WIDTH
        assert target.model in {m.id async for m in sdk.models.list()}
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.chat.completions.create(
                model=target.model, messages=HELLO, max_tokens=4, temperature=-1
            )
        assert bad.value.param == "temperature"
