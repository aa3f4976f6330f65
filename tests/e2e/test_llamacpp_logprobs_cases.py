"""llama.cpp's own server test suite's log-probability cases, re-expressed against miserver.

Issue 42 asks that "llama.cpp's server test suite's logprobs cases pass against
miserver (re-expressed)". The cases are those of `tools/server/tests/unit/` in
ggml-org/llama.cpp that reach the OpenAI-compatible routes; each is restated here
against `miserver serve` with no model argument (`default_server`: SmolLM2's
embedded GGUF on llama.cpp), through the official `openai` SDK as the originals
use it, with the same request and the same assertions. llama.cpp's cases run on
its `tinyllama2` preset, which answers `gpt-3.5-turbo-instruct` for any model
name; miserver serves the model it lists, so the requests name it. Every body
the SDK receives is also held to OpenAI's published schemas (`openai_check`),
which the originals do not do.

Covered (test_chat_completion.py, on `/v1/chat/completions`):

- `test_logprobs`: JSON, `logprobs=True, top_logprobs=10`;
- `test_logprobs_stream`: the same streamed;
- `test_logit_bias`: `logit_bias` of -100 on the ids of a list of words, the ids
  taken from the server's tokenizer (llama.cpp's `/tokenize {"content"}`,
  here vLLM's `/v1/tokenize {"prompt"}`, which miserver serves; neither adds
  special tokens). Not a log-probability case, but `logit_bias` is part of
  issue 42 and the case is on an OpenAI route.

Re-expressed on the OpenAI route that asks the same (test_completion.py, its
`/completion` with `n_probs` becoming `/v1/completions` with `logprobs`, the
`completion_probabilities` array of `{id, token, logprob, bytes, top_logprobs}`
becoming OpenAI's legacy `logprobs` object, ids read through
`return_tokens_as_token_ids`):

- `test_n_probs`: `n_probs: 10, temperature: 0, n_predict: 5`;
- `test_n_probs_stream`: the same streamed (llama.cpp sends one token per event;
  miserver may join a few tokens' text in one chunk, `--stream-interval`, and
  each chunk then carries those tokens' entries).

Out of scope (llama.cpp's own `/completion` fields, which are not OpenAI's):

- test_completion.py `test_n_probs_post_sampling`: `post_sampling_probs` (the
  probabilities after the samplers, as `prob`/`top_probs`) on `/completion`;
  OpenAI has no such field, and miserver reports the distribution before
  temperature and truncation (docs/DECISIONS.md, "Which distribution");
- test_completion.py `test_logit_bias`: `/completion` with `n_predict`, its
  variants with string keys and `[key, bias]` pairs being llama.cpp's own forms
  of `logit_bias`; the OpenAI form (token ids, on an OpenAI route) is
  `test_logit_bias` above.

No other unit test file there (test_compat_oai_responses.py, test_infill.py,
test_speculative.py, ...) asks for `logprobs`, `top_logprobs`, `n_probs` or
`echo`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer, checked_sdk
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

BOOK: list[Any] = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
]
EXCLUDED = [
    "i",
    "I",
    "the",
    "The",
    "to",
    "a",
    "an",
    "be",
    "is",
    "was",
    "but",
    "But",
    "and",
    "And",
    "so",
    "So",
    "you",
    "You",
    "he",
    "He",
    "she",
    "She",
    "we",
    "We",
    "they",
    "They",
    "it",
    "It",
    "his",
    "His",
    "her",
    "Her",
    "book",
    "Book",
]


@pytest.fixture(scope="module")
def client(default_server: LiveServer, openai_check: Check) -> Iterator[OpenAI]:
    """The SDK on the default GGUF server, every body checked against OpenAI's schemas."""
    with checked_sdk(default_server.base_url, openai_check) as sdk:
        yield sdk


def test_logprobs(client: OpenAI) -> None:
    """Re-expresses llama.cpp tools/server/tests/unit/test_chat_completion.py::test_logprobs
    (issue 42): a greedy chat of 5 tokens with `logprobs=True, top_logprobs=10` reports
    `logprobs.content`, each entry with a log-probability <= 0, its bytes and at least
    one alternative, and the entries' tokens spell the message's content."""
    res = client.chat.completions.create(
        model=GGUF_ID,
        temperature=0.0,
        messages=BOOK,
        max_tokens=5,
        logprobs=True,
        top_logprobs=10,
    )
    choice = res.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    aggregated = ""
    for token in choice.logprobs.content:
        aggregated += token.token
        assert token.logprob <= 0.0
        assert token.bytes is not None
        assert len(token.top_logprobs) > 0
    assert aggregated == choice.message.content


def test_logprobs_stream(client: OpenAI) -> None:
    """Re-expresses llama.cpp tools/server/tests/unit/test_chat_completion.py::
    test_logprobs_stream (issue 42): the same chat streamed. The first chunk has the
    assistant role and no text (llama.cpp's case asks `null`; OpenAI's stream, which
    miserver follows, OAI-STREAM-04, sends ""), and no logprobs; no later chunk repeats
    the role; every chunk before the finish carries `logprobs.content`, each entry with a
    log-probability <= 0, its bytes and at least one alternative, and those entries'
    tokens spell the content those chunks carry."""
    stream = client.chat.completions.create(
        model=GGUF_ID,
        temperature=0.0,
        messages=BOOK,
        max_tokens=5,
        logprobs=True,
        top_logprobs=10,
        stream=True,
    )
    output = ""
    aggregated = ""
    for i, chunk in enumerate(stream):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if i == 0:  # llama.cpp's role chunk says `content: null`; OpenAI's (and ours) ""
            assert not choice.delta.content
            assert choice.delta.role == "assistant"
            continue
        assert choice.delta.role is None
        if choice.finish_reason is not None:
            continue
        output += choice.delta.content or ""
        assert choice.logprobs is not None
        assert choice.logprobs.content is not None
        for token in choice.logprobs.content:
            aggregated += token.token
            assert token.logprob <= 0.0
            assert token.bytes is not None
            assert token.top_logprobs is not None
            assert len(token.top_logprobs) > 0
    assert aggregated == output


def test_logit_bias(client: OpenAI, default_server: LiveServer) -> None:
    """Re-expresses llama.cpp tools/server/tests/unit/test_chat_completion.py::test_logit_bias
    (issue 42's `logit_bias`): the ids of " i I the The ... book Book " (the server's own
    tokenizer, no special tokens) each biased -100; a greedy chat of 64 tokens says
    something, and none of those words appears in it between spaces."""
    tokenized = httpx.post(
        f"{default_server.base_url}/tokenize",
        json={
            "model": GGUF_ID,
            "prompt": " " + " ".join(EXCLUDED) + " ",
            "add_special_tokens": False,
        },
        timeout=30.0,
    )
    assert tokenized.status_code == 200, tokenized.text
    logit_bias = {str(token): -100 for token in tokenized.json()["tokens"]}
    res = client.chat.completions.create(
        model=GGUF_ID,
        temperature=0.0,
        messages=BOOK,
        max_tokens=64,
        logit_bias=logit_bias,
    )
    output = res.choices[0].message.content
    assert output
    assert all(output.find(" " + word + " ") == -1 for word in EXCLUDED), output


N_PROBS_PROMPT = "I believe the meaning of life is"


def _n_probs_entries(logprobs: Any) -> list[tuple[int, float, dict[str, float]]]:
    """A legacy `logprobs` object's (id, logprob, top) per token, each held to what
    llama.cpp's n_probs cases ask of a `completion_probabilities` entry: an id above 0, a
    log-probability <= 0, and 10 alternatives (ids above 0, each <= 0)."""
    assert logprobs is not None
    entries = []
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        token_id = int(token.removeprefix("token_id:"))
        assert token_id > 0 and logprob is not None and logprob <= 0.0
        assert top is not None and len(top) == 10  # greedy: the token is the best of them
        for key, value in top.items():
            assert int(key.removeprefix("token_id:")) > 0 and value <= 0.0
        entries.append((token_id, logprob, top))
    return entries


def test_n_probs(client: OpenAI) -> None:
    """Re-expresses llama.cpp tools/server/tests/unit/test_completion.py::test_n_probs
    (issue 42) on /v1/completions: `logprobs=10, temperature=0, max_tokens=5` reports five
    tokens, each with its id, a log-probability <= 0 and 10 alternatives."""
    res = client.completions.create(
        model=GGUF_ID,
        prompt=N_PROBS_PROMPT,
        logprobs=10,
        temperature=0.0,
        max_tokens=5,
        extra_body={"return_tokens_as_token_ids": True},
    )
    assert len(_n_probs_entries(res.choices[0].logprobs)) == 5


def test_n_probs_stream(client: OpenAI) -> None:
    """Re-expresses llama.cpp tools/server/tests/unit/test_completion.py::test_n_probs_stream
    (issue 42): the same streamed; every chunk before the finish carries the entries of the
    tokens whose text it carries (llama.cpp: exactly one; the finish those whose text waited
    for it), each as in `test_n_probs`, and the stream reports the five tokens."""
    stream = client.completions.create(
        model=GGUF_ID,
        prompt=N_PROBS_PROMPT,
        logprobs=10,
        temperature=0.0,
        max_tokens=5,
        stream=True,
        extra_body={"return_tokens_as_token_ids": True},
    )
    reported = 0
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.finish_reason is not None and choice.logprobs is None:
            continue  # the finish, when no token's text waited for it
        entries = _n_probs_entries(choice.logprobs)
        assert len(entries) >= 1
        reported += len(entries)
    assert reported == 5
