"""The default server (SmolLM2's GGUF on llama.cpp) through the official openai SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from tests import openai_reference
from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import LiveServer
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "Hi! What can you do?"}]


@pytest.fixture(scope="module")
def client(default_server: LiveServer, openai_check: Check) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=default_server.base_url,
        api_key="not-needed",
        max_retries=0,
        http_client=openai_reference.client(openai_check),
    ) as sdk:
        yield sdk


def test_default_serves_the_gguf_and_lists_the_conversion(client: OpenAI) -> None:
    """OAI-MODELS-03, OAI-MODELS-06, OAI-GGUF-02: `repo:QUANT` LOADED, conversion READY."""
    models = {m.id: m for m in client.models.list().data}
    assert models[GGUF_ID].model_extra == {"state": "LOADED"}
    assert models[MODEL_ID].model_extra == {"state": "READY"}
    assert client.models.retrieve(GGUF_ID).id == GGUF_ID


def test_chat_and_stream_on_llama_cpp(client: OpenAI) -> None:
    """OAI-GGUF-01, OAI-HDR-10, OAI-SEED-14: the same surface as transformers models."""
    raw = client.chat.completions.with_raw_response.create(
        model=GGUF_ID, messages=HI, max_tokens=12, temperature=0
    )
    reply = raw.parse()
    assert reply.system_fingerprint is not None
    assert reply.system_fingerprint.endswith(":llama.cpp")
    assert "/Q4_1:" in reply.system_fingerprint
    assert raw.headers["X-miLLM-Steering"] == "none"
    assert raw.headers["X-miLLM-Model"] == GGUF_ID
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=GGUF_ID, messages=HI, max_tokens=12, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert text == reply.choices[0].message.content


def test_template_kwargs_are_accepted_and_reported(client: OpenAI) -> None:
    """OAI-GGUF-10, OAI-GGUF-11, OAI-VALID-14, OAI-INTEG-05: accepted, reported, no effect."""
    plain = client.chat.completions.create(model=GGUF_ID, messages=HI, max_tokens=8, temperature=0)
    raw = client.chat.completions.with_raw_response.create(
        model=GGUF_ID,
        messages=HI,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert raw.headers["X-miLLM-Ignored-Fields"] == '"chat_template_kwargs"'
    assert raw.parse().choices[0].message.content == plain.choices[0].message.content


def test_seeded_requests_repeat_on_llama_cpp(client: OpenAI) -> None:
    """OAI-SEED-04, OAI-SEED-05, OAI-GGUF-01 (OAI-SEED-13 superseded): a seed is echoed and the
    same seed, body and model give the same text, `n` choices included."""
    replies = [
        client.chat.completions.with_raw_response.create(
            model=GGUF_ID, messages=HI, max_tokens=12, temperature=1, seed=1, n=2
        )
        for _ in range(2)
    ]
    assert [r.headers["X-miLLM-Seed"] for r in replies] == ['1;scope="request"'] * 2
    texts = [[c.message.content for c in r.parse().choices] for r in replies]
    assert texts[0] == texts[1] and len(texts[0]) == 2


def test_gguf_refusals(client: OpenAI) -> None:
    """OAI-GGUF-05, OAI-GGUF-09: bare repo 404; window 400."""
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model=GGUF_ID, messages=HI, max_tokens=9000)
    assert long.value.code == "context_length_exceeded"
    assert "8192" in long.value.message and "9000" in long.value.message
    client.completions.create(model=GGUF_ID, prompt="One, two,", max_tokens=3)


def test_second_turn_reuses_the_kv_cache(client: OpenAI) -> None:
    """LOC-CHAT-43, LOC-CHAT-44, LOC-CHAT-47: one more message costs that message."""
    first = client.chat.completions.create(model=GGUF_ID, messages=HI, max_tokens=8, temperature=0)
    history = [
        *HI,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Tell me more."},
    ]
    second = client.chat.completions.create(
        model=GGUF_ID, messages=history, max_tokens=8, temperature=0
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= first.usage.prompt_tokens  # type: ignore[union-attr]


def test_continuation_completes_the_partial_answer(client: OpenAI) -> None:
    """OAI-CONT-01..05: a trailing assistant message is continued, not restarted."""
    partial = "Here are three colours: red,"
    reply = client.chat.completions.create(
        model=GGUF_ID,
        max_tokens=8,
        temperature=0,
        messages=[
            {"role": "user", "content": "Name three colours."},
            {"role": "assistant", "content": partial},
        ],
    )
    text = reply.choices[0].message.content or ""
    assert text and not text.startswith(partial) and not text.startswith("Here are")


def test_naming_the_conversion_switches_engines(client: OpenAI) -> None:
    """OAI-ERR-30: a request naming another model loads it first; then back again."""
    hf = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=4, seed=3)
    assert hf.system_fingerprint is not None and hf.system_fingerprint.endswith(":transformers")
    states = {m.id: m.model_extra for m in client.models.list().data}
    assert states[MODEL_ID] == {"state": "LOADED"} and states[GGUF_ID] == {"state": "READY"}
    back = client.chat.completions.create(model=GGUF_ID, messages=HI, max_tokens=4)
    assert back.system_fingerprint is not None and back.system_fingerprint.endswith(":llama.cpp")
