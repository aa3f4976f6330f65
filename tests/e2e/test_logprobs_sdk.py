"""Token log-probabilities (issue 42, contract 0.17.0) through the official `openai` SDK.

Both engines, `miserver serve` as a subprocess: the transformers SmolLM2
(`server`) and the embedded GGUF on llama.cpp (`default_server`). Every body
and every stream event the SDK receives is validated against OpenAI's
published schemas (`tests/openai_reference.py`, whose third adaptation lets
an echoed prompt's first token carry `null`), and each reply is then read
through the SDK's own parsed types, as a client reads it.

The rule (docs/DECISIONS.md, "Contract 0.17.0"): `logprobs` with `max_tokens`
1 scores; with any other `max_tokens` the request generates and reports each
generated token (OAI-SCORE-32's 400 and OAI-VALID-29's `logit_bias` refusal
superseded; scoring served on GGUF, OAI-SCORE-21 and OAI-CSCORE-23 superseded).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.completion_choice import Logprobs

from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import LiveServer, checked_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"
USER: list[Any] = [{"role": "user", "content": "Say hello."}]
BANG = 17  # SmolLM2's id of "!"
ENGINES = ["transformers", "llama.cpp"]


@pytest.fixture(scope="module")
def clients(
    server: LiveServer, default_server: LiveServer, openai_check: Check
) -> Iterator[dict[str, tuple[OpenAI, str]]]:
    """engine -> (an SDK client whose every body is checked, the model it asks for)."""
    with (
        checked_sdk(server.base_url, openai_check) as hf,
        checked_sdk(default_server.base_url, openai_check) as gguf,
    ):
        yield {"transformers": (hf, MODEL_ID), "llama.cpp": (gguf, GGUF_ID)}


@pytest.fixture(params=ENGINES)
def engine(
    request: pytest.FixtureRequest, clients: dict[str, tuple[OpenAI, str]], openai_check: Check
) -> tuple[OpenAI, str]:
    """One engine's client and model (`openai_check` named so every body is held to it)."""
    return clients[request.param]


def _descending(values: Sequence[float]) -> bool:
    return all(a >= b for a, b in itertools.pairwise(values))


def _chat_entries_are_openais(entries: list[ChatCompletionTokenLogprob], top: int) -> None:
    """OAI-CSCORE-14..16, -18 for each generated token: `{token, logprob, bytes,
    top_logprobs}`, `bytes` its UTF-8, at most `top` alternatives, most probable first."""
    for entry in entries:
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert entry.logprob <= 0
        assert 1 <= len(entry.top_logprobs) <= top
        assert _descending([alt.logprob for alt in entry.top_logprobs])
        for alt in entry.top_logprobs:
            assert alt.bytes == list(alt.token.encode("utf-8"))
            assert alt.logprob <= 0


def _text_of(entries: list[ChatCompletionTokenLogprob]) -> str:
    return b"".join(bytes(e.bytes or []) for e in entries).decode("utf-8")


def _legacy_is_consistent(logprobs: Logprobs | None, text: str, start: int, top: int) -> None:
    """OAI-SCORE-15, -16: the legacy arrays are one entry a token, the tokens spell `text`,
    `text_offset` counts from `start` by each token's text, at most `top` alternatives."""
    assert logprobs is not None
    tokens, values = logprobs.tokens, logprobs.token_logprobs
    tops, offsets = logprobs.top_logprobs, logprobs.text_offset
    assert tokens is not None and values is not None and tops is not None and offsets is not None
    assert len(tokens) == len(values) == len(tops) == len(offsets)
    assert "".join(tokens) == text
    expected = [start + len("".join(tokens[:i])) for i in range(len(tokens))]
    assert offsets == expected
    for value, alternatives in zip(values, tops, strict=True):
        assert value is not None and value <= 0
        # OpenAI's legacy API: the k best, and the token itself when not among them
        assert alternatives is not None and 1 <= len(alternatives) <= top + 1
        assert all(v <= 0 for v in alternatives.values())


def test_chat_generation_reports_each_token(engine: tuple[OpenAI, str]) -> None:
    """Issue 42, OAI-CSCORE-14..16, -18, OAI-STREAM-01..03 (OAI-SCORE-32 superseded):
    `logprobs=True, top_logprobs=3, max_tokens=5` generates; the parsed
    `choice.logprobs.content` holds one entry per generated token (5 or fewer), each with
    at most 3 alternatives sorted descending, the greedy token first; streamed, the chunks'
    entries add up to the same tokens."""
    client, model = engine
    asked: dict[str, Any] = {"model": model, "messages": USER, "max_tokens": 5, "temperature": 0}
    reply = client.chat.completions.create(**asked, logprobs=True, top_logprobs=3)
    (choice,) = reply.choices
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert 1 <= len(entries) <= 5
    assert len(entries) == 5 or choice.finish_reason == "stop"
    _chat_entries_are_openais(entries, 3)
    for entry in entries:  # temperature 0: the reported token is the top alternative
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
    assert _text_of(entries) == choice.message.content

    streamed: list[ChatCompletionTokenLogprob] = []
    text = ""
    for chunk in client.chat.completions.create(
        **asked, logprobs=True, top_logprobs=3, stream=True
    ):
        if not chunk.choices:
            continue
        (part,) = chunk.choices
        text += part.delta.content or ""
        if part.logprobs is not None and part.logprobs.content is not None:
            streamed.extend(part.logprobs.content)
    _chat_entries_are_openais(streamed, 3)
    assert _text_of(streamed) == text
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-3)


def test_completion_generation_reports_each_token(engine: tuple[OpenAI, str]) -> None:
    """Issue 42, OAI-SCORE-02, -15, -16, OAI-STREAM-01, -02 (OAI-SCORE-32 superseded):
    `logprobs=2, max_tokens=4` generates; the legacy arrays agree in length, spell the text,
    and `text_offset` starts at the prompt's length; streamed, the chunks' arrays continue
    one another and add up to the same tokens."""
    client, model = engine
    asked: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    reply = client.completions.create(**asked, logprobs=2)
    (choice,) = reply.choices
    _legacy_is_consistent(choice.logprobs, choice.text, len(PROMPT), 2)
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    tokens = choice.logprobs.tokens
    assert 1 <= len(tokens) <= 4
    assert reply.usage is not None and reply.usage.completion_tokens >= len(tokens)
    for token, value, alternatives in zip(
        tokens,
        choice.logprobs.token_logprobs or [],
        choice.logprobs.top_logprobs or [],
        strict=True,
    ):
        assert alternatives is not None
        assert max(alternatives, key=alternatives.__getitem__) == token  # greedy
        assert alternatives[token] == value

    text = ""
    streamed: list[str] = []
    values: list[float | None] = []
    offsets: list[int] = []
    for chunk in client.completions.create(**asked, logprobs=2, stream=True):
        if not chunk.choices:
            continue
        (part,) = chunk.choices
        if part.logprobs is not None:
            _legacy_is_consistent(part.logprobs, part.text, len(PROMPT) + len(text), 2)
            streamed += part.logprobs.tokens or []
            values += part.logprobs.token_logprobs or []
            offsets += part.logprobs.text_offset or []
        text += part.text
    assert streamed == tokens and "".join(streamed) == text == choice.text
    assert offsets == choice.logprobs.text_offset
    assert values == pytest.approx(choice.logprobs.token_logprobs, abs=1e-3)


def test_echo_without_generating_is_lm_evals_loglikelihood(engine: tuple[OpenAI, str]) -> None:
    """Issue 42, OAI-SCORE-15, -16: lm-eval's `echo=True, logprobs=1, max_tokens=0`: the text
    is the prompt, one legacy entry per prompt token, the first with `null` log-probability
    and alternatives (nothing predicts it; the SDK keeps the nulls), offsets from 0,
    nothing generated."""
    client, model = engine
    reply = client.completions.create(
        model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
    )
    (choice,) = reply.choices
    assert choice.text == PROMPT
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert "".join(logprobs.tokens) == PROMPT
    assert reply.usage is not None and reply.usage.completion_tokens == 0
    assert len(logprobs.tokens) == reply.usage.prompt_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset == [
        len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))
    ]
    for value, alternatives in zip(
        logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert value is not None and value <= 0
        assert alternatives is not None and 1 <= len(alternatives) <= 2  # k + 1: the token
        assert value <= max(alternatives.values())


def test_echo_with_one_token_scores(engine: tuple[OpenAI, str]) -> None:
    """Issue 42, OAI-SCORE-01, -12, -15, -36 (OAI-SCORE-21 superseded on GGUF): lm-eval's
    `echo=True, logprobs=1, max_tokens=1, temperature=0` is a scoring request: unsteered, the
    prompt's entries then the most probable next token, the prompt's log-probabilities
    those the echo without a token reports."""
    client, model = engine
    raw = client.completions.with_raw_response.create(
        model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    assert raw.headers["X-miLLM-Steering"] == "none"
    (choice,) = raw.parse().choices
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    scored, top = logprobs.tokens[-1], logprobs.top_logprobs[-1]
    assert scored == choice.text[len(PROMPT) :]
    assert top is not None and list(top) == [scored]
    assert logprobs.token_logprobs[-1] == top[scored]
    assert logprobs.text_offset is not None and logprobs.text_offset[-1] == len(PROMPT)
    echoed = client.completions.create(
        model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
    ).choices[0]
    assert echoed.logprobs is not None and echoed.logprobs.token_logprobs is not None
    assert logprobs.tokens[:-1] == echoed.logprobs.tokens
    assert logprobs.token_logprobs[1:-1] == pytest.approx(
        echoed.logprobs.token_logprobs[1:], abs=1e-3
    )


def test_logit_bias_is_honoured(engine: tuple[OpenAI, str]) -> None:
    """Issue 42 (OAI-VALID-29 superseded): `logit_bias` is served on chat and completions.
    +100 on one id makes every token that id, sampled at temperature 1 too, and its
    log-probability 0 (the only token left); -100 bans the greedy token, which no longer
    appears among the alternatives."""
    client, model = engine
    ids = {"return_tokens_as_token_ids": True}
    reply = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=3,
        temperature=1,
        logprobs=True,
        top_logprobs=2,
        logit_bias={str(BANG): 100},
        extra_body=ids,
    )
    (choice,) = reply.choices
    assert choice.message.content == "!!!"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [e.token for e in choice.logprobs.content] == [f"token_id:{BANG}"] * 3
    assert all(e.logprob == pytest.approx(0.0, abs=1e-6) for e in choice.logprobs.content)

    asked: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    plain = client.completions.create(**asked, logprobs=2, extra_body=ids).choices[0].logprobs
    assert plain is not None and plain.tokens is not None
    greedy = plain.tokens[0]
    banned = client.completions.create(
        **asked, logprobs=2, logit_bias={greedy.removeprefix("token_id:"): -100}, extra_body=ids
    ).choices[0]
    assert banned.logprobs is not None and banned.logprobs.top_logprobs is not None
    assert banned.logprobs.tokens is not None and banned.logprobs.tokens[0] != greedy
    first = banned.logprobs.top_logprobs[0]
    assert first is not None and greedy not in first
    forced = client.completions.create(**asked, logit_bias={str(BANG): 100}).choices[0]
    assert forced.text == "!!"


def test_each_choice_has_its_own_logprobs(engine: tuple[OpenAI, str]) -> None:
    """Issue 42, OAI-CSCORE-14, OAI-SCORE-15, -16, OAI-CMPL-02: chat's `n=2` with logprobs
    gives each choice the entries of its own tokens; on completions (where `n` stays refused)
    each prompt of a list gets its own, its offsets from its own prompt's length."""
    client, model = engine
    chat = client.chat.completions.create(
        model=model,
        messages=USER,
        n=2,
        temperature=1,
        seed=7,
        max_tokens=3,
        logprobs=True,
        top_logprobs=1,
    )
    assert [c.index for c in chat.choices] == [0, 1]
    for choice in chat.choices:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert 1 <= len(choice.logprobs.content) <= 3
        _chat_entries_are_openais(choice.logprobs.content, 1)
        assert _text_of(choice.logprobs.content) == choice.message.content
    prompts = [PROMPT, "One, two,"]
    text = client.completions.create(
        model=model, prompt=prompts, max_tokens=3, temperature=0, logprobs=1
    )
    assert [c.index for c in text.choices] == [0, 1]
    for each, prompt in zip(text.choices, prompts, strict=True):
        _legacy_is_consistent(each.logprobs, each.text, len(prompt), 1)
