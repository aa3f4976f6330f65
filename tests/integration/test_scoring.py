"""Scoring mode through HTTP: next-token log-probabilities from one forward pass.

Every expected value comes from a direct float32 forward of the same token
ids through the resident model (`torch.log_softmax` of the last position),
never from miserver's own scoring code. Refusals that need no model run on
`bare_client` and check that nothing was loaded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.base import ChatPrompt
from miserver.engines.transformers.engine import TransformersEngine
from miserver.settings import Settings
from tests.conftest import GGUF_ID, MODEL_ID, SAE_ID, LocalClient
from tests.errors import assert_nothing_loaded, error_of

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
VOCAB = 49152
PROMPT = "The capital of France is"
USER = [{"role": "user", "content": "What is the capital of France?"}]
STEERING = "X-miLLM-Steering"
RUNG = "X-miLLM-Circuit-Rung"
ALLOWED = [17, 260, 1000, 5000, 30000, VOCAB - 1]
"""Arbitrary ids, none of them the prompt's best next token (" Paris")."""
TOL = 3e-5
"""Against a full forward. Its lm_head runs over every position, the server's over the last
one only (`logits_to_keep=1`); in float32 the two differ by up to about 1.3e-5 in a
log-probability (measured on the chat prompts here), so 1e-5 would be flaky. Every effect
tested (temperature, the allowed set, steering) moves the numbers by 1e-2 or more."""
LAST_ROW_TOL = 1e-9
"""Against a forward that, like the server's, keeps only the last position's logits."""


# -- helpers -----------------------------------------------------------------------------


def engine_of(client: TestClient) -> TransformersEngine:
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    assert isinstance(engine, TransformersEngine)
    return engine


def direct_logits(engine: TransformersEngine, ids: Sequence[int]) -> torch.Tensor:
    """The last position's logits of a plain float32 forward, no miserver code involved."""
    with torch.inference_mode():
        logits: torch.Tensor = engine.model(torch.tensor([list(ids)])).logits[0, -1].float()
    return logits


def last_row_logits(engine: TransformersEngine, ids: Sequence[int]) -> torch.Tensor:
    """The same forward with `logits_to_keep=1`: the lm_head over the last position only,
    on a thread of its own that runs as many torch threads as the engine's. (OpenMP keeps
    a thread count per thread: this test thread's may be another, after other tests ran
    torch here, and a matmul split across other threads differs in its last bits.)"""

    def forward() -> torch.Tensor:
        torch.set_num_threads(engine.facts.threads)
        with torch.inference_mode():
            out = engine.model(torch.tensor([list(ids)]), logits_to_keep=1)
        return out.logits[0, -1].float()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(forward).result()


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax of float32 logits, summed in float64.

    float32's own log-sum-exp over 49152 logits is off by about 1e-5, as much
    as the tolerance; the logits themselves stay the float32 forward's.
    """
    return torch.log_softmax(logits.double(), dim=-1)


def direct_logprobs(
    engine: TransformersEngine, ids: Sequence[int], temperature: float = 0.0
) -> torch.Tensor:
    logits = direct_logits(engine, ids)
    if temperature > 0:
        logits = logits / temperature
    return log_softmax(logits)


def top_ids(logprobs: torch.Tensor, k: int) -> list[int]:
    return [int(i) for i in torch.topk(logprobs, k).indices]


def prompt_ids(engine: TransformersEngine, text: str = PROMPT, add: bool = True) -> list[int]:
    return [int(i) for i in engine.tokenize(text, add_special_tokens=add)]


def chat_ids(engine: TransformersEngine, messages: list[dict[str, Any]] = USER) -> list[int]:
    return [int(i) for i in engine.render_chat(ChatPrompt(tuple(messages)))]


def post(client: TestClient, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers[STEERING] == "none"  # OAI-SCORE-36, OAI-CSCORE-22
    assert RUNG not in response.headers  # OAI-SCORE-36
    return response


def score(client: TestClient, **body: Any) -> dict[str, Any]:
    """A completions scoring request (max_tokens 1, the prompt unless given)."""
    payload = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 1, **body}
    return dict(post(client, COMPLETIONS, payload).json())


def chat_score(client: TestClient, **body: Any) -> dict[str, Any]:
    payload = {"model": MODEL_ID, "messages": USER, "max_tokens": 1, **body}
    return dict(post(client, CHAT, payload).json())


def id_keyed(top: dict[str, float]) -> dict[int, float]:
    assert all(key.startswith("token_id:") for key in top), top
    return {int(key.removeprefix("token_id:")): value for key, value in top.items()}


def assert_close(got: dict[int, float], expected: torch.Tensor, tol: float = TOL) -> None:
    """Each reported id's log-probability against the reference vector."""
    for token_id, value in got.items():
        assert value == pytest.approx(float(expected[token_id]), abs=tol), token_id


@contextmanager
def forwards(engine: TransformersEngine) -> Iterator[list[int]]:
    """Count the model's top-level forward calls inside the block (one list entry each)."""
    calls: list[int] = []
    handle = engine.model.register_forward_hook(lambda _m, args, _o: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


# -- completions: the numbers --------------------------------------------------------------


def test_top_k_equals_a_direct_forward(client: TestClient) -> None:
    """OAI-SCORE-01, -02, -11, -12, -15, -16, -36: `logprobs: 5` is log_softmax of one forward."""
    engine = engine_of(client)
    ids = prompt_ids(engine)
    expected = direct_logprobs(engine, ids)
    best5 = top_ids(expected, 5)
    texts = [engine.token_text(i) for i in best5]
    assert len(set(texts)) == 5  # no two share a text key here (merging: unit-tested)
    with forwards(engine) as calls:
        body = score(client, logprobs=5)
    assert len(calls) == 1  # one forward pass, nothing generated (OAI-SCORE-11)
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["text"] == texts[0] == " Paris"  # the most probable token (OAI-SCORE-12)
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert logprobs["tokens"] == [texts[0]]
    assert len(logprobs["token_logprobs"]) == 1
    assert logprobs["token_logprobs"][0] == pytest.approx(float(expected[best5[0]]), abs=TOL)
    assert len(logprobs["top_logprobs"]) == 1
    top = logprobs["top_logprobs"][0]
    assert list(top) == texts  # the five best, best first
    for text, token_id in zip(texts, best5, strict=True):
        assert top[text] == pytest.approx(float(expected[token_id]), abs=TOL)
    assert logprobs["text_offset"] == [len(PROMPT)]  # OAI-SCORE-16
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_exactly_one_last_position_forward(client: TestClient, path: str) -> None:
    """OAI-SCORE-11, OAI-CSCORE-01: the numbers are one forward's, to float64 rounding."""
    engine = engine_of(client)
    if path == CHAT:
        ids = chat_ids(engine)
        body = chat_score(client, logprobs=True, top_logprobs=20, return_tokens_as_token_ids=True)
        (entry,) = body["choices"][0]["logprobs"]["content"]
        got = id_keyed({a["token"]: a["logprob"] for a in entry["top_logprobs"]})
    else:
        ids = prompt_ids(engine)
        body = score(client, logprobs=20, return_tokens_as_token_ids=True)
        got = id_keyed(body["choices"][0]["logprobs"]["top_logprobs"][0])
    expected = log_softmax(last_row_logits(engine, ids))
    assert list(got) == top_ids(expected, 20)
    assert_close(got, expected, LAST_ROW_TOL)


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        ({"logprobs": 0}, 0),
        ({"logprobs": 1}, 1),
        ({"logprobs": 20}, 20),
        ({"logprobs": 0, "allowed_token_ids": ALLOWED}, len(ALLOWED)),
        ({"logprobs": 20, "allowed_token_ids": ALLOWED}, len(ALLOWED)),
    ],
    ids=[
        "OAI-SCORE-02-0",
        "OAI-SCORE-02-1",
        "OAI-SCORE-02-20",
        "OAI-SCORE-05-0",
        "OAI-SCORE-05-20",
    ],
)
def test_alternatives_count(client: TestClient, extra: dict[str, Any], count: int) -> None:
    """OAI-SCORE-02, OAI-SCORE-05: `logprobs` alternatives; with a set, every listed id."""
    body = score(client, return_tokens_as_token_ids=True, **extra)
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"]) == 1
    assert len(logprobs["top_logprobs"][0]) == count
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 1


def test_allowed_ids_are_normalised_over_the_set(client: TestClient) -> None:
    """OAI-SCORE-03, -04, -05, -12, -15: every listed id, log_softmax over the set, sum 1."""
    engine = engine_of(client)
    logits = direct_logits(engine, prompt_ids(engine))
    subset = log_softmax(logits[torch.tensor(ALLOWED)])
    expected = dict(zip(ALLOWED, subset.tolist(), strict=True))
    best = max(expected, key=expected.__getitem__)
    body = score(client, logprobs=1, allowed_token_ids=ALLOWED, return_tokens_as_token_ids=True)
    (choice,) = body["choices"]
    got = id_keyed(choice["logprobs"]["top_logprobs"][0])
    assert sorted(got) == sorted(ALLOWED)  # all six although logprobs is 1 (OAI-SCORE-05)
    for token_id, value in got.items():
        assert value == pytest.approx(expected[token_id], abs=TOL), token_id
    assert math.fsum(math.exp(v) for v in got.values()) == pytest.approx(1.0, abs=1e-6)
    assert list(got.values()) == sorted(got.values(), reverse=True)
    assert choice["text"] == engine.token_text(best) != " Paris"  # constrained (OAI-SCORE-12)
    assert choice["logprobs"]["tokens"] == [f"token_id:{best}"]
    assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(expected[best], abs=TOL)


def test_allowed_ids_keyed_by_text(client: TestClient) -> None:
    """OAI-SCORE-05, -15: without token-id keys, every listed id appears under its text."""
    engine = engine_of(client)
    texts = [engine.token_text(i) for i in ALLOWED]
    assert len(set(texts)) == len(ALLOWED)
    logits = direct_logits(engine, prompt_ids(engine))
    subset = log_softmax(logits[torch.tensor(ALLOWED)]).tolist()
    top = score(client, logprobs=0, allowed_token_ids=ALLOWED)["choices"][0]["logprobs"]
    assert set(top["top_logprobs"][0]) == set(texts)
    for text, value in zip(texts, subset, strict=True):
        assert top["top_logprobs"][0][text] == pytest.approx(value, abs=TOL)


@pytest.mark.parametrize("temperature", [2.0, 0.5, 0.001], ids=lambda t: f"T={t}")
def test_temperature_divides_the_logits(client: TestClient, temperature: float) -> None:
    """OAI-SCORE-13, OAI-SCORE-26: log_softmax(logits / T); 0.001 is the smallest accepted T."""
    engine = engine_of(client)
    expected = direct_logprobs(engine, prompt_ids(engine), temperature)
    body = score(client, logprobs=5, temperature=temperature, return_tokens_as_token_ids=True)
    got = id_keyed(body["choices"][0]["logprobs"]["top_logprobs"][0])
    assert list(got) == top_ids(expected, 5)
    tol = TOL / temperature if temperature < 1 else TOL  # float32 logits, divided by T
    assert_close(got, expected, tol)


def test_temperature_zero_means_no_scaling(client: TestClient) -> None:
    """OAI-SCORE-13, OAI-SCORE-26: T 0 (accepted) and T 1 both equal the unscaled softmax."""
    engine = engine_of(client)
    expected = direct_logprobs(engine, prompt_ids(engine))
    zero = score(client, logprobs=5, temperature=0, return_tokens_as_token_ids=True)
    one = score(client, logprobs=5, temperature=1, return_tokens_as_token_ids=True)
    unset = score(client, logprobs=5, return_tokens_as_token_ids=True)
    got = id_keyed(zero["choices"][0]["logprobs"]["top_logprobs"][0])
    assert list(got) == top_ids(expected, 5)
    assert_close(got, expected)
    assert zero["choices"] == one["choices"] == unset["choices"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_sampling_fields_have_no_effect(client: TestClient, path: str) -> None:
    """OAI-SCORE-14, OAI-CSCORE-01: top_p, stop and the penalties leave the numbers as they are."""
    base: dict[str, Any] = {"model": MODEL_ID, "max_tokens": 1}
    if path == CHAT:
        base |= {"messages": USER, "logprobs": True, "top_logprobs": 5}
    else:
        base |= {"prompt": PROMPT, "logprobs": 5}
    plain = post(client, path, base).json()
    knobs = {
        "top_p": 0.05,
        "stop": [" Paris", "Paris", " The", "."],
        "frequency_penalty": 2.0,
        "presence_penalty": -2.0,
    }
    for name, value in knobs.items():
        tuned = post(client, path, {**base, name: value}).json()
        assert tuned["choices"] == plain["choices"], name
    tuned = post(client, path, {**base, **knobs}).json()
    assert tuned["choices"] == plain["choices"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_seed_is_echoed_and_changes_nothing(client: TestClient, path: str) -> None:
    """OAI-SEED-10 (OAI-SEED-04, OAI-VALID-02): a seed on a scoring request is accepted and
    echoed in X-miLLM-Seed, is not reported unused (strict mode accepts it), and leaves the
    numbers as they are; without one there is no X-miLLM-Seed (OAI-SEED-08)."""
    base: dict[str, Any] = {"model": MODEL_ID, "max_tokens": 1}
    if path == CHAT:
        base |= {"messages": USER, "logprobs": True, "top_logprobs": 5}
    else:
        base |= {"prompt": PROMPT, "logprobs": 5}
    plain = post(client, path, base)
    assert "X-miLLM-Seed" not in plain.headers
    for seed in (7, 4294967295):
        response = client.post(
            path, json={**base, "seed": seed}, headers={"X-miLLM-Strict": "true"}
        )
        assert response.status_code == 200, response.text
        assert response.headers["X-miLLM-Seed"] == f'{seed};scope="request"'
        assert "X-miLLM-Ignored-Fields" not in response.headers
        assert response.json()["choices"] == plain.json()["choices"]


def test_allowed_without_logprobs_constrains_only(client: TestClient) -> None:
    """OAI-SCORE-17, OAI-CSCORE-19: the best allowed token, and `logprobs: null`."""
    engine = engine_of(client)
    logits = direct_logits(engine, prompt_ids(engine))
    best = ALLOWED[int(torch.argmax(logits[torch.tensor(ALLOWED)]))]
    (choice,) = score(client, allowed_token_ids=ALLOWED)["choices"]
    assert choice["logprobs"] is None
    assert choice["text"] == engine.token_text(best)

    logits = direct_logits(engine, chat_ids(engine))
    best = ALLOWED[int(torch.argmax(logits[torch.tensor(ALLOWED)]))]
    for extra in ({}, {"logprobs": False}):
        (choice,) = chat_score(client, allowed_token_ids=ALLOWED, **extra)["choices"]
        assert choice["logprobs"] is None
        assert choice["message"] == {
            "role": "assistant",
            "content": engine.token_text(best),
            "refusal": None,
        }


def test_token_id_keys(client: TestClient) -> None:
    """OAI-SCORE-07: `return_tokens_as_token_ids` keys `tokens` and `top_logprobs` by id."""
    engine = engine_of(client)
    expected = direct_logprobs(engine, prompt_ids(engine))
    best3 = top_ids(expected, 3)
    (choice,) = score(client, logprobs=3, return_tokens_as_token_ids=True)["choices"]
    assert list(choice["logprobs"]["top_logprobs"][0]) == [f"token_id:{i}" for i in best3]
    assert choice["logprobs"]["tokens"] == [f"token_id:{best3[0]}"]
    assert choice["text"] == engine.token_text(best3[0])  # the text stays text


def test_chat_token_id_keys_keep_the_bytes(client: TestClient) -> None:
    """OAI-CSCORE-17: only `token` becomes `token_id:<id>`; `bytes` is the decoded text's UTF-8."""
    engine = engine_of(client)
    expected = direct_logprobs(engine, chat_ids(engine))
    best3 = top_ids(expected, 3)
    body = chat_score(client, logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True)
    (choice,) = body["choices"]
    (entry,) = choice["logprobs"]["content"]
    assert entry["token"] == f"token_id:{best3[0]}"
    assert entry["bytes"] == list(engine.token_text(best3[0]).encode("utf-8"))
    assert choice["message"]["content"] == engine.token_text(best3[0])
    for alt, token_id in zip(entry["top_logprobs"], best3, strict=True):
        assert alt["token"] == f"token_id:{token_id}"
        assert alt["bytes"] == list(engine.token_text(token_id).encode("utf-8"))
        assert alt["logprob"] == pytest.approx(float(expected[token_id]), abs=TOL)


@pytest.mark.parametrize(
    "text", [PROMPT, "<|im_start|>user\nHi<|im_end|>\n"], ids=["plain", "special-text"]
)
def test_add_special_tokens(client: TestClient, text: str) -> None:
    """OAI-SCORE-06, OAI-CMPL-05, OAI-TOKIDS-06: the prompt is tokenised as the flag says."""
    engine = engine_of(client)
    for flag in (None, True, False):
        add = flag is not False  # absent means true
        ids = prompt_ids(engine, text, add)
        extra = {} if flag is None else {"add_special_tokens": flag}
        body = score(client, prompt=text, logprobs=3, return_tokens_as_token_ids=True, **extra)
        assert body["usage"]["prompt_tokens"] == len(ids), flag
        got = id_keyed(body["choices"][0]["logprobs"]["top_logprobs"][0])
        expected = direct_logprobs(engine, ids)
        assert list(got) == top_ids(expected, 3)
        assert_close(got, expected)


def test_several_prompts(client: TestClient) -> None:
    """OAI-SCORE-11, -15, -16: one choice per prompt in order, one forward pass each."""
    engine = engine_of(client)
    prompts = [PROMPT, "1, 2, 3, 4,", "Héllo ☀ wörld"]
    ids = [prompt_ids(engine, p) for p in prompts]
    with forwards(engine) as calls:
        body = score(client, prompt=prompts, logprobs=2, return_tokens_as_token_ids=True)
    assert len(calls) == len(prompts)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for choice, text, prompt_token_ids in zip(body["choices"], prompts, ids, strict=True):
        expected = direct_logprobs(engine, prompt_token_ids)
        got = id_keyed(choice["logprobs"]["top_logprobs"][0])
        assert list(got) == top_ids(expected, 2)
        assert_close(got, expected)
        assert choice["text"] == engine.token_text(top_ids(expected, 1)[0])
        assert choice["logprobs"]["text_offset"] == [len(text)]
    assert body["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


def test_max_completion_tokens_one_is_accepted(client: TestClient) -> None:
    """OAI-SCORE-09, OAI-CSCORE-04: `max_completion_tokens: 1` stands for `max_tokens: 1`."""
    body = {"model": MODEL_ID, "prompt": PROMPT, "logprobs": 2, "max_completion_tokens": 1}
    assert len(post(client, COMPLETIONS, body).json()["choices"][0]["logprobs"]["tokens"]) == 1
    chat = {"model": MODEL_ID, "messages": USER, "logprobs": True, "max_completion_tokens": 1}
    assert len(post(client, CHAT, chat).json()["choices"][0]["logprobs"]["content"]) == 1


# -- chat scoring ------------------------------------------------------------------------


def test_chat_scoring_shape(client: TestClient) -> None:
    """OAI-CSCORE-01, -02, -13..16, -18, -22: one content entry, `top_logprobs` of 3."""
    engine = engine_of(client)
    ids = chat_ids(engine)
    expected = direct_logprobs(engine, ids)
    best3 = top_ids(expected, 3)
    body = chat_score(client, logprobs=True, top_logprobs=3)
    assert body["object"] == "chat.completion"
    assert body["usage"]["prompt_tokens"] == len(ids)
    (choice,) = body["choices"]
    best_text = engine.token_text(best3[0])
    assert choice["message"] == {"role": "assistant", "content": best_text, "refusal": None}
    assert "content" in choice["logprobs"]
    (entry,) = choice["logprobs"]["content"]  # exactly one entry (OAI-CSCORE-14)
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert entry["token"] == best_text
    assert entry["logprob"] == pytest.approx(float(expected[best3[0]]), abs=TOL)
    assert entry["bytes"] == list(best_text.encode("utf-8"))
    assert len(entry["top_logprobs"]) == 3
    for alt, token_id in zip(entry["top_logprobs"], best3, strict=True):
        assert set(alt) == {"token", "logprob", "bytes"}  # OAI-CSCORE-15
        text = engine.token_text(token_id)
        assert alt["token"] == text
        assert alt["bytes"] == list(text.encode("utf-8"))  # OAI-CSCORE-16
        assert alt["logprob"] == pytest.approx(float(expected[token_id]), abs=TOL)


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        ({}, 0),
        ({"top_logprobs": 0}, 0),
        ({"top_logprobs": 20}, 20),
        ({"top_logprobs": 3, "allowed_token_ids": ALLOWED}, 3),
        ({"top_logprobs": 20, "allowed_token_ids": ALLOWED}, len(ALLOWED)),
    ],
    ids=["absent", "zero", "twenty", "3-of-6-allowed", "20-of-6-allowed"],
)
def test_chat_top_logprobs_count(client: TestClient, extra: dict[str, Any], count: int) -> None:
    """OAI-CSCORE-03, OAI-CSCORE-18: min(top_logprobs, candidates) entries; none when absent/0."""
    (entry,) = chat_score(client, logprobs=True, **extra)["choices"][0]["logprobs"]["content"]
    assert len(entry["top_logprobs"]) == count


def test_chat_allowed_ids_are_normalised_over_the_set(client: TestClient) -> None:
    """OAI-CSCORE-01, OAI-SCORE-04: chat normalises over `allowed_token_ids` as completions do."""
    engine = engine_of(client)
    logits = direct_logits(engine, chat_ids(engine))
    subset = log_softmax(logits[torch.tensor(ALLOWED)]).tolist()
    expected = dict(zip(ALLOWED, subset, strict=True))
    body = chat_score(
        client,
        logprobs=True,
        top_logprobs=20,
        allowed_token_ids=ALLOWED,
        return_tokens_as_token_ids=True,
    )
    (entry,) = body["choices"][0]["logprobs"]["content"]
    got = {int(a["token"].removeprefix("token_id:")): a["logprob"] for a in entry["top_logprobs"]}
    assert sorted(got) == sorted(ALLOWED)
    for token_id, value in got.items():
        assert value == pytest.approx(expected[token_id], abs=TOL)
    assert math.fsum(math.exp(v) for v in got.values()) == pytest.approx(1.0, abs=1e-6)
    best = max(expected, key=expected.__getitem__)
    assert entry["token"] == f"token_id:{best}"


def test_chat_scoring_equals_completion_of_the_render(client: TestClient) -> None:
    """OAI-CSCORE-09, -10, -11, OAI-TOKIDS-01: chat = completions of the rendered text, no BOS."""
    engine = engine_of(client)
    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
    ]
    rendered = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert isinstance(rendered, str)
    ids = chat_ids(engine, messages)
    assert prompt_ids(engine, rendered, add=False) == ids
    chat = chat_score(
        client, messages=messages, logprobs=True, top_logprobs=5, return_tokens_as_token_ids=True
    )
    text = score(
        client,
        prompt=rendered,
        add_special_tokens=False,
        logprobs=5,
        return_tokens_as_token_ids=True,
    )
    assert chat["usage"]["prompt_tokens"] == text["usage"]["prompt_tokens"] == len(ids)
    (entry,) = chat["choices"][0]["logprobs"]["content"]
    cmpl = text["choices"][0]["logprobs"]
    assert entry["token"] == cmpl["tokens"][0]
    assert chat["choices"][0]["message"]["content"] == text["choices"][0]["text"]
    assert entry["logprob"] == pytest.approx(cmpl["token_logprobs"][0], abs=1e-9)
    from_chat = {a["token"]: a["logprob"] for a in entry["top_logprobs"]}
    assert list(from_chat) == list(cmpl["top_logprobs"][0])
    for key, value in from_chat.items():
        assert value == pytest.approx(cmpl["top_logprobs"][0][key], abs=1e-9)
    assert_close(id_keyed(from_chat), direct_logprobs(engine, ids))


# -- refusals --------------------------------------------------------------------------------


def cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 1, "logprobs": 2, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": USER, "max_tokens": 1, "logprobs": True, **extra}


INLINE = {"sae_id": SAE_ID, "features": [{"index": 5, "strength": 10.0}]}
SCORING = "invalid_scoring_request"  # an id outside the vocabulary, a prompt of no tokens
RULE = "invalid_parameter"  # a broken scoring rule (REQ-000 open point 9)
NOT_HONOURED = "field_not_honoured"


@pytest.mark.parametrize(
    ("path", "body", "code", "param"),
    [
        (COMPLETIONS, cmpl(max_tokens=5, allowed_token_ids=[1, 2]), RULE, "max_tokens"),
        (COMPLETIONS, cmpl(max_tokens=None, allowed_token_ids=[1]), RULE, "max_tokens"),
        (
            COMPLETIONS,
            cmpl(max_tokens=None, max_completion_tokens=2, allowed_token_ids=[1]),
            RULE,
            "max_tokens",
        ),
        (
            COMPLETIONS,
            cmpl(logprobs=None, allowed_token_ids=[1], max_tokens=2),
            RULE,
            "max_tokens",
        ),
        (CHAT, chat(max_tokens=2, allowed_token_ids=[1]), RULE, "max_tokens"),
        (CHAT, chat(max_tokens=None, allowed_token_ids=[1]), RULE, "max_tokens"),
        (COMPLETIONS, cmpl(n=2), NOT_HONOURED, "n"),
        (CHAT, chat(n=2), RULE, "n"),
        (COMPLETIONS, cmpl(stream=True), RULE, "stream"),
        (CHAT, chat(stream=True), RULE, "stream"),
        (CHAT, chat(logprobs=None, allowed_token_ids=[1], stream=True), RULE, "stream"),
        (COMPLETIONS, cmpl(temperature=0.0005), RULE, "temperature"),
        (CHAT, chat(temperature=0.0005), RULE, "temperature"),
        (COMPLETIONS, cmpl(profile="humor"), NOT_HONOURED, "profile"),
        (COMPLETIONS, cmpl(steering_intensity=1.0), NOT_HONOURED, "steering_intensity"),
        (COMPLETIONS, cmpl(steering=INLINE), NOT_HONOURED, "steering"),
        (
            COMPLETIONS,
            cmpl(response_format={"type": "json_object"}),
            NOT_HONOURED,
            "response_format",
        ),
        (CHAT, chat(profile="humor"), NOT_HONOURED, "profile"),
        (CHAT, chat(steering_intensity=0.5), NOT_HONOURED, "steering_intensity"),
        (CHAT, chat(steering=INLINE), NOT_HONOURED, "steering"),
        (
            CHAT,
            chat(response_format={"type": "json_object"}),
            "response_format_unsupported",  # a combination: REQ-000 open point 10
            "response_format",
        ),
        (
            CHAT,
            chat(tools=[{"type": "function", "function": {"name": "f"}}]),
            NOT_HONOURED,
            "tools",
        ),
        (CHAT, chat(logprobs=None, top_logprobs=2), "invalid_parameter", "top_logprobs"),
        (CHAT, chat(logprobs=False, top_logprobs=2), "invalid_parameter", "top_logprobs"),
        (COMPLETIONS, cmpl(allowed_token_ids=[]), RULE, "allowed_token_ids"),
        (COMPLETIONS, cmpl(allowed_token_ids=[3, -1]), SCORING, "allowed_token_ids[1]"),
        (CHAT, chat(allowed_token_ids=[-7]), SCORING, "allowed_token_ids[0]"),
    ],
    ids=[
        "OAI-SCORE-09-max_tokens-5",
        "OAI-SCORE-09-max_tokens-absent",
        "OAI-SCORE-09-max_completion_tokens-2",
        "OAI-SCORE-09-allowed-max_tokens-2",
        "OAI-CSCORE-04-max_tokens-2",
        "OAI-CSCORE-04-max_tokens-absent",
        "OAI-SCORE-10-n",
        "OAI-CSCORE-05-n",
        "OAI-SCORE-stream",
        "OAI-CSCORE-06-stream",
        "OAI-CSCORE-06-allowed-stream",
        "OAI-SCORE-26-temperature",
        "OAI-CSCORE-07-temperature",
        "OAI-SCORE-27-profile",
        "OAI-SCORE-28-steering_intensity",
        "OAI-SCORE-29-steering",
        "OAI-SCORE-30-response_format",
        "OAI-CSCORE-24-profile",
        "OAI-CSCORE-24-steering_intensity",
        "OAI-CSCORE-24-steering",
        "OAI-CSCORE-24-response_format",
        "OAI-CSCORE-24-tools",
        "OAI-CSCORE-08-absent",
        "OAI-CSCORE-08-false",
        "OAI-SCORE-03-empty-set",
        "OAI-SCORE-19-negative",
        "OAI-SCORE-19-chat-negative",
    ],
)
def test_scoring_refusals_before_any_load(
    bare_client: TestClient, path: str, body: dict[str, Any], code: str, param: str
) -> None:
    """OAI-SCORE-09/10/19/26..30, OAI-CSCORE-04..08/24: 400 naming the field, no load.

    A broken scoring rule is `invalid_parameter` (REQ-000 open point 9); OAI-ERR-16 keeps
    `invalid_scoring_request` for ids outside the vocabulary (negative ones here). Since
    contract 0.17.0 `logprobs` with `max_tokens` other than 1 generates (OAI-SCORE-32 is
    superseded, docs/DECISIONS.md), so the `max_tokens` rule is held with
    `allowed_token_ids`, which only scoring takes."""
    body = {k: v for k, v in body.items() if v is not None}
    error_of(bare_client.post(path, json=body), 400, code, param)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, {"prompt": PROMPT, "logprobs": 2, "scoring_precision": "float32"},
         "scoring_precision"),
        (CHAT, {"messages": USER, "logprobs": True, "extra_messages": [USER]}, "extra_messages"),
    ],
    ids=["OAI-VALID-30-gguf", "OAI-VALID-17-gguf"],
)  # fmt: skip
def test_gguf_refuses_float32_and_batched_scoring_before_loading(
    bare_client: TestClient, path: str, body: dict[str, Any], param: str
) -> None:
    """OAI-VALID-30, OAI-VALID-17: GGUF scores since contract 0.17.0 (OAI-SCORE-21 and
    OAI-CSCORE-23 are superseded, docs/DECISIONS.md), but not from a float32 copy, and not
    `extra_messages`: 400 field_not_honoured naming the field, before any load."""
    response = bare_client.post(path, json={"model": GGUF_ID, "max_tokens": 1, **body})
    error_of(response, 400, NOT_HONOURED, param)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, cmpl(allowed_token_ids=[1, VOCAB]), "allowed_token_ids[1]"),
        (COMPLETIONS, cmpl(allowed_token_ids=[10**9]), "allowed_token_ids[0]"),
        (CHAT, chat(allowed_token_ids=[VOCAB, 3]), "allowed_token_ids[0]"),
    ],
    ids=["OAI-SCORE-19-vocab", "OAI-SCORE-19-huge", "OAI-SCORE-19-chat"],
)
def test_out_of_vocabulary_ids_are_refused(
    client: TestClient, path: str, body: dict[str, Any], param: str
) -> None:
    """OAI-SCORE-19: an id past the loaded model's vocabulary names its position."""
    error_of(client.post(path, json=body), 400, SCORING, param)


def test_last_vocabulary_id_is_accepted(client: TestClient) -> None:
    """OAI-SCORE-19: the vocabulary's last id (vocab_size - 1) is a valid candidate."""
    engine = engine_of(client)
    assert engine.facts.vocab_size == VOCAB
    body = score(client, logprobs=None, allowed_token_ids=[VOCAB - 1])
    assert body["choices"][0]["text"] == engine.token_text(VOCAB - 1)


def test_out_of_vocabulary_position_counts_repeated_ids(client: TestClient) -> None:
    """OAI-SCORE-19: the refused id's position is its position in the request as sent."""
    body = cmpl(allowed_token_ids=[5, 5, VOCAB])
    error_of(client.post(COMPLETIONS, json=body), 400, SCORING, "allowed_token_ids[2]")


@pytest.mark.parametrize(
    "prompt", ["", [PROMPT, ""]], ids=["OAI-SCORE-20-empty", "OAI-SCORE-20-second-empty"]
)
def test_a_prompt_of_no_tokens_is_refused(client: TestClient, prompt: Any) -> None:
    """OAI-SCORE-20: a prompt that tokenises to nothing is 400 invalid_scoring_request."""
    body = cmpl(prompt=prompt, add_special_tokens=False)
    error = error_of(client.post(COMPLETIONS, json=body), 400, SCORING, "prompt")
    assert f"prompt {0 if prompt == '' else 1}" in error["message"]


# -- steering never reaches scoring ------------------------------------------------------------


@pytest.fixture
def steered_client(steer_settings: Settings) -> Iterator[TestClient]:
    with LocalClient(Server(steer_settings), raise_server_exceptions=False) as client:
        yield client


def test_scoring_is_never_steered(steered_client: TestClient) -> None:
    """OAI-SCORE-33, -36, OAI-CSCORE-22: live values steer generation, never scoring."""
    client = steered_client
    engine = engine_of(client)
    ids = prompt_ids(engine)
    expected = direct_logprobs(engine, ids)  # before anything is attached
    chat_expected = direct_logprobs(engine, chat_ids(engine))
    greedy = {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "temperature": 0}
    plain = client.post(CHAT, json=greedy)
    assert plain.status_code == 200 and plain.headers[STEERING] == "none"

    response = client.post("/api/steering/attachments", json={"sae_id": SAE_ID})
    assert response.status_code in (200, 201), response.text
    values = {"features": [{"index": 5, "strength": 150}]}
    response = client.put(f"/api/steering/attachments/{SAE_ID}/12/features", json=values)
    assert response.status_code == 200, response.text

    steered = client.post(CHAT, json=greedy)
    assert steered.status_code == 200
    assert steered.headers[STEERING].startswith("manual;")
    assert steered.json()["choices"][0]["message"] != plain.json()["choices"][0]["message"]

    body = score(client, logprobs=5, return_tokens_as_token_ids=True)  # asserts `none`
    got = id_keyed(body["choices"][0]["logprobs"]["top_logprobs"][0])
    assert list(got) == top_ids(expected, 5)
    assert_close(got, expected)
    chat_body = chat_score(client, logprobs=True, top_logprobs=5, return_tokens_as_token_ids=True)
    (entry,) = chat_body["choices"][0]["logprobs"]["content"]
    got = id_keyed({a["token"]: a["logprob"] for a in entry["top_logprobs"]})
    assert list(got) == top_ids(chat_expected, 5)
    assert_close(got, chat_expected)
    # and the live values are still there for the next generation
    assert client.post(CHAT, json=greedy).headers[STEERING] == steered.headers[STEERING]
