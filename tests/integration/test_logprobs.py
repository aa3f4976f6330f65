"""Token log-probabilities over HTTP on both engines (issue 42, contract 0.17.0): a
generation's tokens, echo, `logit_bias`, steering and streams (docs/DECISIONS.md, "Contract
0.17.0: token log-probabilities").

Every number is checked against a forward of the same token ids that runs no miserver code:
on transformers `AutoModelForCausalLM` in float32 over the converted folder, on llama.cpp a
bare `llama_cpp.Llama` with every position's logits kept; both log-softmaxed in float64.
Requests send token ids or ask for `return_tokens_as_token_ids`, so every id is known. The
transformers server is the session's `client`; the GGUF one is this module's. Row `i` of a
reference is the distribution of the token after position `i`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
import torch
from starlette.testclient import TestClient
from transformers import AutoModelForCausalLM

from miserver.app import Server
from miserver.engines.base import ChatPrompt, Engine
from miserver.settings import Settings
from miserver.steering import steering_set_hash
from miserver.steering.header import parse
from tests.conftest import (
    ENGINE_THREADS,
    GGUF_ID,
    MODEL_ID,
    SAE_ID,
    LocalClient,
    cache_dir,
    steering_settings,
)
from tests.errors import error_of
from tests.events import data_of
from tests.models import converted_default

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
STEERING = "X-miLLM-Steering"
ENGINES = ["transformers", "gguf"]
PROMPT = "The capital of France is"
OTHER = "Once upon a time, a small"
COUNTING = "1, 1, 1, 1, 1, 1, 1,"  # its greedy next token, " ", recurs in a sample
USER = [{"role": "user", "content": "Name three colours."}]
K = 3
HF_TOL = 1e-4
"""transformers: the server's float32 log-sum-exp (over the last position's lm_head) against
a float64 one over a full forward differ by about 1e-5 (tests/integration/test_scoring.py)."""
GGUF_TOL = 1e-3
"""llama.cpp: the server decodes token by token with flash attention and a kept prefix, the
reference evaluates every id in one batch without; their logits differ in the last bits."""
LAYER = 12  # the trained SAE's hook layer
FEATURE = {5: 150.0}  # a strength that visibly moves SmolLM2's distribution (test_scoring)

Reference = Callable[[Sequence[int]], torch.Tensor]


# -- the servers and the references ------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server whose launch model is the embedded GGUF (the default), on llama.cpp."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("gguf-logprobs"),
        cache_dir=cache_dir(),
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def hf_reference() -> Reference:
    """log_softmax (float64) of every position of a float32 transformers forward."""
    model = AutoModelForCausalLM.from_pretrained(converted_default(), dtype=torch.float32)

    def forward(ids: Sequence[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([list(ids)])).logits[0].float()
        return torch.log_softmax(logits.double(), dim=-1)

    return forward


@pytest.fixture(scope="module")
def gguf_reference(gguf_path: Path) -> Iterator[Reference]:
    """log_softmax (float64) of every position of a bare llama.cpp eval of the ids.

    With flash attention, as the server's engine loads a model (engines/llamacpp/loading.py,
    llama-server's `-fa auto` on a CPU): on SmolLM2's Q4_1 the CPU kernel's float16 sums move
    a log-probability by up to 0.1 from the plain attention's."""
    llama = llama_cpp.Llama(
        str(gguf_path),
        logits_all=True,
        n_ctx=512,
        n_threads=1,
        flash_attn=True,  # as the server loads it: without, log-probabilities move by up to 0.1
        verbose=False,
    )

    def forward(ids: Sequence[int]) -> torch.Tensor:
        llama.reset()  # type: ignore[no-untyped-call]
        llama.eval(list(ids))
        scores = np.array(llama.scores[: len(ids)], dtype=np.float64)
        return torch.log_softmax(torch.from_numpy(scores), dim=-1)

    yield forward
    llama.close()


@dataclass(frozen=True)
class Served:
    """One engine's server: its client, model id, the tolerance against its reference."""

    name: str
    client: TestClient
    model: str
    tol: float

    @property
    def engine(self) -> Engine:
        engine: Engine = self.client.app.state.manager.resident.engine  # type: ignore[attr-defined]
        return engine

    def ids(self, text: str) -> list[int]:
        return [int(i) for i in self.engine.tokenize(text)]

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [int(i) for i in self.engine.render_chat(ChatPrompt(tuple(messages)))]

    def send(self, path: str, **body: Any) -> Any:
        return self.client.post(path, json={"model": self.model, **body})

    def post(self, path: str, **body: Any) -> dict[str, Any]:
        response = self.send(path, **body)
        assert response.status_code == 200, response.text
        assert response.headers[STEERING] == "none"
        return dict(response.json())


@pytest.fixture(params=ENGINES)
def served(request: pytest.FixtureRequest) -> Served:
    if request.param == "transformers":
        return Served("transformers", request.getfixturevalue("client"), MODEL_ID, HF_TOL)
    return Served("gguf", request.getfixturevalue("gguf_client"), GGUF_ID, GGUF_TOL)


@pytest.fixture
def reference(served: Served, request: pytest.FixtureRequest) -> Reference:
    """The independent forward of `served`'s engine (loaded once per module)."""
    name = "hf_reference" if served.name == "transformers" else "gguf_reference"
    forward: Reference = request.getfixturevalue(name)
    return forward


# -- checks -------------------------------------------------------------------------------


def id_of(key: str) -> int:
    assert key.startswith("token_id:"), key
    return int(key.removeprefix("token_id:"))


def id_keyed(top: dict[str, float]) -> dict[int, float]:
    return {id_of(key): value for key, value in top.items()}


def chat_top(entry: dict[str, Any]) -> dict[int, float]:
    return {id_of(a["token"]): a["logprob"] for a in entry["top_logprobs"]}


def check_position(
    row: torch.Tensor,
    token: int,
    logprob: float,
    top: dict[int, float],
    k: int,
    tol: float,
    *,
    greedy: bool,
) -> None:
    """One reported position against the reference `row` (log-probabilities over the
    vocabulary): the token's own value, the `k` best (sorted, each value, and that they are
    the best; a completion's map may add the token itself last, OpenAI's k + 1), and for a
    greedy pick that it was the most probable token."""
    assert logprob == pytest.approx(float(row[token]), abs=tol), token
    if k and len(top) == k + 1:  # completions: the token itself, not among the k best, last
        *best, (last, value) = top.items()
        assert last == token and value == logprob and token not in dict(best)
        top = dict(best)
    values = list(top.values())
    assert len(top) == k
    assert values == sorted(values, reverse=True)  # best first
    for token_id, value in top.items():
        assert value == pytest.approx(float(row[token_id]), abs=tol), token_id
    if k:
        kth_best = float(torch.topk(row, k).values[-1])
        assert min(values) >= kth_best - tol  # the k best, up to ties within tol
    if greedy:
        assert float(row[token]) >= float(row.max()) - tol  # temperature 0 picked the best
        if k:
            assert next(iter(top)) == token and top[token] == logprob


def offsets_of(tokens: Sequence[str], start: int = 0) -> list[int]:
    """Each text token's character offset, counting on from `start`."""
    out, at = [], start
    for token in tokens:
        out.append(at)
        at += len(token)
    return out


# -- 1. a generation's tokens against an independent forward -----------------------------------


def test_completion_tokens_equal_an_independent_forward(
    served: Served, reference: Reference
) -> None:
    """issue 42 (1), OAI-SCORE-02, OAI-SCORE-07, OAI-SCORE-15, OAI-SCORE-16: a completion of
    several tokens at temperature 0 reports each token's log-probability and its `logprobs`
    best, those of a forward of prompt + completion; the first offset is the prompt text's
    length."""
    ids = served.ids(PROMPT)
    body = served.post(
        COMPLETIONS,
        prompt=ids,
        max_tokens=6,
        temperature=0,
        logprobs=K,
        return_tokens_as_token_ids=True,
    )
    (choice,) = body["choices"]
    logprobs = choice["logprobs"]
    made = [id_of(t) for t in logprobs["tokens"]]
    assert len(made) == body["usage"]["completion_tokens"] > 1
    assert served.engine.decode(made) == choice["text"]
    expected = reference(ids + made)
    for j, token in enumerate(made):
        top = id_keyed(logprobs["top_logprobs"][j])
        row = expected[len(ids) + j - 1]
        check_position(row, token, logprobs["token_logprobs"][j], top, K, served.tol, greedy=True)
    assert logprobs["text_offset"][0] == len(PROMPT)
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])


def test_chat_tokens_equal_an_independent_forward(served: Served, reference: Reference) -> None:
    """issue 42 (1), OAI-CSCORE-14, OAI-CSCORE-15, OAI-CSCORE-16, OAI-CSCORE-17: a chat of
    several tokens at temperature 0 with `logprobs: true, top_logprobs: k` reports each
    token's log-probability and its k best, those of a forward of the rendered prompt + the
    reply; `bytes` stay the decoded text's."""
    ids = served.chat_ids(USER)
    body = served.post(
        CHAT,
        messages=USER,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=K,
        return_tokens_as_token_ids=True,
    )
    assert body["usage"]["prompt_tokens"] == len(ids)
    (choice,) = body["choices"]
    content = choice["logprobs"]["content"]
    made = [id_of(e["token"]) for e in content]
    assert len(made) == body["usage"]["completion_tokens"] > 1
    assert served.engine.decode(made) == choice["message"]["content"]
    expected = reference(ids + made)
    for j, (token, entry) in enumerate(zip(made, content, strict=True)):
        row = expected[len(ids) + j - 1]
        check_position(row, token, entry["logprob"], chat_top(entry), K, served.tol, greedy=True)
        for item in (entry, *entry["top_logprobs"]):
            text = served.engine.token_text(id_of(item["token"]))
            assert item["bytes"] == list(text.encode("utf-8"))


# -- 2. echo ---------------------------------------------------------------------------------


PROMPT_KINDS = ["text", "ids", "list"]


@pytest.mark.parametrize("max_tokens", [0, 1], ids=["max_tokens-0", "max_tokens-1-scoring"])
@pytest.mark.parametrize("kind", PROMPT_KINDS)
def test_echo_reports_each_prompt_token(
    served: Served, reference: Reference, kind: str, max_tokens: int
) -> None:
    """issue 42 (2), OAI-SCORE-15, OAI-SCORE-16: `echo: true, logprobs: k` with `max_tokens`
    0 (nothing generated, the text is the prompt's) and 1 (lm-eval's scoring request, unsteered)
    answers each prompt's tokens with the log-probabilities of a forward of it, the first
    null; with text prompts, a token-id prompt and a list of prompts."""
    texts = [PROMPT, OTHER] if kind == "list" else [PROMPT]
    prompt: Any = {"text": PROMPT, "ids": served.ids(PROMPT), "list": texts}[kind]
    body = served.post(
        COMPLETIONS,
        prompt=prompt,
        echo=True,
        logprobs=K,
        max_tokens=max_tokens,
        temperature=0,
        return_tokens_as_token_ids=True,
    )
    assert [c["index"] for c in body["choices"]] == list(range(len(texts)))
    assert body["usage"]["completion_tokens"] == max_tokens * len(texts)
    for text, choice in zip(texts, body["choices"], strict=True):
        ids = served.ids(text)
        logprobs = choice["logprobs"]
        tokens = [id_of(t) for t in logprobs["tokens"]]
        assert tokens[: len(ids)] == ids and len(tokens) == len(ids) + max_tokens
        assert choice["text"].startswith(text)
        if max_tokens == 0:
            assert choice["text"] == text
        assert logprobs["token_logprobs"][0] is None  # nothing predicts the first token
        assert logprobs["top_logprobs"][0] is None
        assert logprobs["text_offset"][0] == 0
        expected = reference(tokens)
        for i in range(1, len(tokens)):
            check_position(
                expected[i - 1],
                tokens[i],
                logprobs["token_logprobs"][i],
                id_keyed(logprobs["top_logprobs"][i]),
                K,
                served.tol,
                greedy=i >= len(ids),
            )
        if max_tokens:
            assert logprobs["text_offset"][len(ids)] == len(text)


@pytest.mark.parametrize("max_tokens", [0, 1], ids=["max_tokens-0", "max_tokens-1-scoring"])
def test_echo_text_offsets_count_the_prompt_from_zero(served: Served, max_tokens: int) -> None:
    """issue 42 (2), OAI-SCORE-16: keyed by text, an echo's tokens spell the prompt, their
    `text_offset` counts from 0 and the completion's token starts at the prompt text's
    length."""
    body = served.post(
        COMPLETIONS, prompt=PROMPT, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0
    )
    (choice,) = body["choices"]
    logprobs = choice["logprobs"]
    tokens = logprobs["tokens"]
    assert "".join(tokens) == choice["text"]
    assert "".join(tokens[: len(tokens) - max_tokens]) == PROMPT
    assert logprobs["text_offset"] == offsets_of(tokens)
    if max_tokens:
        assert logprobs["text_offset"][-1] == len(PROMPT)


# -- 3. the alternatives -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "as_ids"), [(0, True), (5, False), (5, True)], ids=["0", "5-text-keys", "5-id-keys"]
)
def test_completion_alternatives_are_sorted_and_start_with_the_token(
    served: Served, k: int, as_ids: bool
) -> None:
    """issue 42 (3), OAI-SCORE-02, OAI-SCORE-07, OAI-SCORE-18: at temperature 0 each position's
    `top_logprobs` holds at most `logprobs` entries, best first, the first the chosen token
    at its own log-probability; keys are `token_id:<id>` with `return_tokens_as_token_ids`."""
    body = served.post(
        COMPLETIONS,
        prompt=PROMPT,
        max_tokens=3,
        temperature=0,
        logprobs=k,
        return_tokens_as_token_ids=as_ids,
    )
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 3
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert logprob <= 0.0
        assert len(top) <= k
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        if as_ids:
            id_of(token)
            assert all(key.startswith("token_id:") for key in top)
            assert len(top) == k
        if k:
            assert next(iter(top)) == token
            if as_ids:
                assert top[token] == logprob
            else:  # two ids of one text share an entry: the sum of their probabilities
                assert top[token] >= logprob


@pytest.mark.parametrize(
    ("k", "as_ids"),
    [(None, False), (0, True), (5, False), (5, True)],
    ids=["absent", "0", "5-text-keys", "5-id-keys"],
)
def test_chat_alternatives_are_sorted_and_start_with_the_token(
    served: Served, k: int | None, as_ids: bool
) -> None:
    """issue 42 (3), OAI-CSCORE-15, OAI-CSCORE-16, OAI-CSCORE-17, OAI-CSCORE-18: at
    temperature 0 each token's `top_logprobs` holds `top_logprobs` entries (none when absent
    or 0), best first, the first the chosen token at its own log-probability; `token_id:<id>`
    tokens keep their text's bytes."""
    extra = {} if k is None else {"top_logprobs": k}
    body = served.post(
        CHAT,
        messages=USER,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        return_tokens_as_token_ids=as_ids,
        **extra,
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == (k or 0)
        values = [a["logprob"] for a in top]
        assert values == sorted(values, reverse=True)
        for item in (entry, *top):
            nested = {"top_logprobs"} if item is entry else set()
            assert set(item) == {"token", "logprob", "bytes", *nested}
            key = item["token"]
            text = served.engine.token_text(id_of(key)) if as_ids else key
            assert item["bytes"] == list(text.encode("utf-8"))
        if k:
            assert top[0]["token"] == entry["token"]
            assert top[0]["logprob"] == entry["logprob"]


# -- 4. logit_bias -------------------------------------------------------------------------------


def sampled(served: Served, path: str, prompt: str, **body: Any) -> list[dict[str, Any]]:
    """A generation's tokens as {"id", "logprob", "top"} (ids known through
    `return_tokens_as_token_ids`)."""
    if path == CHAT:
        reply = served.post(
            CHAT,
            messages=[{"role": "user", "content": prompt}],
            logprobs=True,
            top_logprobs=body.pop("k", 0),
            return_tokens_as_token_ids=True,
            **body,
        )
        content = reply["choices"][0]["logprobs"]["content"]
        return [
            {"id": id_of(e["token"]), "logprob": e["logprob"], "top": chat_top(e)} for e in content
        ]
    reply = served.post(
        COMPLETIONS,
        prompt=prompt,
        logprobs=body.pop("k", 0),
        return_tokens_as_token_ids=True,
        **body,
    )
    logprobs = reply["choices"][0]["logprobs"]
    return [
        {"id": id_of(t), "logprob": lp, "top": id_keyed(top)}
        for t, lp, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    ]


def test_a_banned_token_is_never_sampled(served: Served) -> None:
    """issue 42 (4): `logit_bias` -100 on the greedy token (" " after "1, 1, ... 1,", which a
    sample of the counting picks again and again) bans it: at temperature 1 it is never
    sampled, nor reported among the 5 best, at any position."""
    greedy = sampled(served, COMPLETIONS, COUNTING, max_tokens=2, temperature=0)
    banned = greedy[0]["id"]
    biased = sampled(
        served,
        COMPLETIONS,
        COUNTING,
        max_tokens=8,
        temperature=1,
        seed=1,
        k=5,
        logit_bias={str(banned): -100},
    )
    assert len(biased) == 8
    for token in biased:
        assert token["id"] != banned
        assert banned not in token["top"]
        # the 5 best, and a sampled token not among them after them (OpenAI's k + 1)
        assert len(token["top"]) == 5 or (len(token["top"]) == 6 and token["id"] in token["top"])


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
def test_a_token_biased_plus_100_is_the_only_choice(served: Served, path: str) -> None:
    """issue 42 (4): `logit_bias` +100 on one token: at temperature 1 every generated token is
    that one, at log-probability 0 and the only alternative (the others are at -inf)."""
    (only,) = served.engine.tokenize(" dog", add_special_tokens=False)
    tokens = sampled(
        served,
        path,
        PROMPT,
        max_tokens=6,
        temperature=1,
        seed=7,
        k=3,
        logit_bias={str(only): 100},
    )
    assert len(tokens) == 6
    for token in tokens:
        assert token["id"] == only
        assert token["logprob"] == pytest.approx(0.0, abs=1e-6)
        assert token["top"] == {only: token["logprob"]}


def test_a_bias_moves_the_reported_distribution(served: Served, reference: Reference) -> None:
    """issue 42 (4), docs/DECISIONS.md "Which distribution": the reported log-probabilities are
    those of the biased logits, at every generated position."""
    ids = served.ids(PROMPT)
    first, second = (int(i) for i in torch.topk(reference(ids)[-1], 2).indices)
    bias = {first: -2.5, second: 1.5}  # the best (" Paris") falls behind the runner-up
    tokens = sampled(
        served,
        COMPLETIONS,
        PROMPT,
        max_tokens=4,
        temperature=0,
        k=K,
        logit_bias={str(i): v for i, v in bias.items()},
    )
    made = [t["id"] for t in tokens]
    assert made[0] == second
    expected = reference(ids + made)
    added = torch.zeros(expected.shape[-1], dtype=torch.float64)
    for token_id, value in bias.items():
        added[token_id] = value
    for j, token in enumerate(tokens):
        row = torch.log_softmax(expected[len(ids) + j - 1] + added, dim=-1)
        check_position(row, token["id"], token["logprob"], token["top"], K, served.tol, greedy=True)
    unbiased = expected[len(ids) - 1]
    assert abs(tokens[0]["logprob"] - float(unbiased[made[0]])) > 0.1  # the bias showed


BAD_BIASES = [
    ({"abc": 1}, "logit_bias.abc"),
    ({"5": 150}, "logit_bias.5"),
    ({"5": -101}, "logit_bias.5"),
    ({"49152": 1}, "logit_bias.49152"),  # SmolLM2's vocabulary is 0..49151
]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
@pytest.mark.parametrize(
    ("bias", "param"), BAD_BIASES, ids=["not-an-id", "150", "-101", "past-the-vocabulary"]
)
def test_a_bad_bias_is_refused_naming_its_key(
    served: Served, path: str, bias: dict[str, int], param: str
) -> None:
    """issue 42 (4): a `logit_bias` key that is not a token id, a value outside -100..100 or an
    id past the model's vocabulary is 400 invalid_parameter naming `logit_bias.<key>`."""
    body: dict[str, Any] = {"max_tokens": 2, "logit_bias": bias}
    if path == CHAT:
        body["messages"] = USER
    else:
        body["prompt"] = PROMPT
    error_of(served.send(path, **body), 400, "invalid_parameter", param)


# -- 6. steering -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def steer_client(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[TestClient]:
    """The transformers SmolLM2 with the trained SAE attached at its layer (nothing set)."""
    settings = steering_settings(tmp_path_factory.mktemp("steer-logprobs") / "data", saes_dir)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        response = client.post("/api/steering/attachments", json={"sae_id": SAE_ID})
        assert response.status_code in (200, 201), response.text
        yield client


@pytest.fixture
def steered(steer_client: TestClient) -> Served:
    return Served("transformers", steer_client, MODEL_ID, HF_TOL)


def inline(pairs: dict[int, float]) -> dict[str, Any]:
    return {"sae_id": SAE_ID, "features": [{"index": i, "strength": s} for i, s in pairs.items()]}


def steering_of(response: Any) -> str:
    assert response.status_code == 200, response.text
    [value] = response.headers.get_list(STEERING)
    parse(value)  # the header's grammar (OAI-GRAM-01)
    return str(value)


def ran(source: str, pairs: dict[int, float]) -> str:
    """The header of `pairs` (none of them clamped) applied by `source` (inline, manual)."""
    hashed = steering_set_hash(SAE_ID, list(pairs.items()))
    return f'{source};sae="{SAE_ID}";layer={LAYER};features={len(pairs)};hash="{hashed}"'


def firsts(body: dict[str, Any], path: str) -> tuple[str, float, list[str]]:
    """A reply's first token: its key, its log-probability, its alternatives' keys."""
    logprobs = body["choices"][0]["logprobs"]
    if path == CHAT:
        entry = logprobs["content"][0]
        return entry["token"], entry["logprob"], [a["token"] for a in entry["top_logprobs"]]
    return logprobs["tokens"][0], logprobs["token_logprobs"][0], list(logprobs["top_logprobs"][0])


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
def test_a_steered_generation_reports_its_steered_distribution(steered: Served, path: str) -> None:
    """issue 42 (6), OAI-INL-01: a generation with `logprobs` and inline `steering` is steered
    like any generation: its log-probabilities differ from the unsteered ones, its header says
    what ran, and at temperature 0 each token is its own distribution's best."""
    body: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "logprobs": True}
    if path == CHAT:
        body |= {"messages": USER, "top_logprobs": 2}
    else:
        body |= {"prompt": PROMPT, "logprobs": 2}
    plain = steered.post(path, **body)
    response = steered.send(path, steering=inline(FEATURE), **body)
    assert steering_of(response) == ran("inline", FEATURE)
    token, logprob, top = firsts(response.json(), path)
    assert top[0] == token  # temperature 0 picked its own distribution's best
    _, plain_logprob, _ = firsts(plain, path)
    assert abs(logprob - plain_logprob) > 1e-3


def echo(client: Served, max_tokens: int, **extra: Any) -> Any:
    body = {
        "prompt": PROMPT,
        "echo": True,
        "logprobs": 1,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_tokens_as_token_ids": True,
        **extra,
    }
    return client.send(COMPLETIONS, **body)


def test_log_likelihoods_under_steering_are_an_echo_with_max_tokens_0(
    steered: Served, hf_reference: Reference
) -> None:
    """issue 42 (6), OAI-SCORE-29, OAI-SCORE-33, OAI-SCORE-36: `echo: true, logprobs: 1,
    max_tokens: 0` with inline `steering` is a steered generation: the prompt's
    log-probabilities differ from the unsteered echo's (which are a plain forward's) and the
    header says what ran; the same request with `max_tokens: 1` is scoring and refused 400
    naming `steering`."""
    plain = echo(steered, 0)
    assert steering_of(plain) == "none"
    plain_values = plain.json()["choices"][0]["logprobs"]["token_logprobs"]
    ids = steered.ids(PROMPT)
    expected = hf_reference(ids)
    for i in range(1, len(ids)):
        assert plain_values[i] == pytest.approx(float(expected[i - 1, ids[i]]), abs=HF_TOL)

    response = echo(steered, 0, steering=inline(FEATURE))
    assert steering_of(response) == ran("inline", FEATURE)
    choice = response.json()["choices"][0]
    assert choice["text"] == PROMPT
    values = choice["logprobs"]["token_logprobs"]
    assert values[0] is None and len(values) == len(ids)
    assert max(abs(a - b) for a, b in zip(values[1:], plain_values[1:], strict=True)) > 1e-2

    refused = echo(steered, 1, steering=inline(FEATURE))
    error_of(refused, 400, "field_not_honoured", "steering")
    scoring = {"prompt": PROMPT, "max_tokens": 1, "logprobs": 1, "steering": inline(FEATURE)}
    error_of(steered.send(COMPLETIONS, **scoring), 400, "field_not_honoured", "steering")
    chat = {"messages": USER, "max_tokens": 1, "logprobs": True, "steering": inline(FEATURE)}
    error_of(steered.send(CHAT, **chat), 400, "field_not_honoured", "steering")  # OAI-CSCORE-24


def test_the_operators_steering_reaches_an_echo_but_never_scoring(steered: Served) -> None:
    """issue 42 (6), OAI-SCORE-33, OAI-SCORE-36: under the operator's steering (live values),
    an echo with `max_tokens: 0` is steered as the same features inline steer it (equal
    log-probabilities, a `manual` header), while `max_tokens: 1` scores unsteered."""
    plain = echo(steered, 0).json()["choices"][0]["logprobs"]["token_logprobs"]
    inline_values = echo(steered, 0, steering=inline(FEATURE)).json()["choices"][0]["logprobs"]
    features = {"features": [{"index": i, "strength": s} for i, s in FEATURE.items()]}
    path = f"/api/steering/attachments/{SAE_ID}/{LAYER}/features"
    response = steered.client.put(path, json=features)
    assert response.status_code == 200, response.text
    try:
        manual = echo(steered, 0)
        assert steering_of(manual) == ran("manual", FEATURE)
        values = manual.json()["choices"][0]["logprobs"]["token_logprobs"]
        assert values[1:] == pytest.approx(inline_values["token_logprobs"][1:], abs=1e-6)
        scoring = echo(steered, 1)
        assert steering_of(scoring) == "none"
        scored = scoring.json()["choices"][0]["logprobs"]["token_logprobs"]
        assert scored[1 : len(plain)] == pytest.approx(plain[1:], abs=HF_TOL)
    finally:
        response = steered.client.put(path, json={"features": []})
        assert response.status_code == 200, response.text


# -- 7. streams ----------------------------------------------------------------------------------


def streamed(served: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's chunks (its headers go before the steering is known: the last chunk says
    it)."""
    response = served.send(path, stream=True, **body)
    assert response.status_code == 200, response.text
    events = data_of(response.text.splitlines())
    assert events[-1] == "[DONE]"
    assert events[-2]["millm_steering"] == "none"
    return [e for e in events[:-1] if isinstance(e, dict)]


def joined_stream(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A stream's text, its `logprobs` entries concatenated, and its finish reason, shaped as
    a JSON reply's choice."""
    chunks = [c for c in streamed(served, path, body) if c["choices"]]
    choices = [c["choices"][0] for c in chunks]
    present = [c["logprobs"] for c in choices if c["logprobs"] is not None]
    if path == CHAT:
        text = "".join(c["delta"].get("content") or "" for c in choices)
        return {
            "message": {"content": text},
            "logprobs": {"content": [e for p in present for e in p["content"]]},
            "finish_reason": choices[-1]["finish_reason"],
        }
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {
        "text": "".join(c["text"] for c in choices),
        "logprobs": {k: [x for p in present for x in p[k]] for k in keys},
        "finish_reason": choices[-1]["finish_reason"],
    }


def same_choice(reply: dict[str, Any], stream: dict[str, Any], path: str) -> None:
    if path == CHAT:
        assert stream["message"]["content"] == reply["message"]["content"]
        assert stream["logprobs"]["content"] == reply["logprobs"]["content"]
    else:
        assert stream["text"] == reply["text"]
        assert stream["logprobs"] == {k: reply["logprobs"][k] for k in stream["logprobs"]}
    assert stream["finish_reason"] == reply["finish_reason"]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT], ids=["completions", "chat"])
def test_a_streams_logprobs_are_the_replys(served: Served, path: str) -> None:
    """issue 42 (7): every chunk's `logprobs` entries, concatenated, are exactly the JSON
    reply's for the same request at temperature 0 (seeded, so llama.cpp reuses no prefix);
    and so with a stop string whose first token is held back as its prefix: that token's
    entry still comes, and the stop string's own."""
    body: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "seed": 11}
    if path == CHAT:
        body |= {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
        body |= {"logprobs": True, "top_logprobs": 2}
    else:
        body |= {"prompt": PROMPT, "logprobs": 2}
    reply = served.post(path, **body)["choices"][0]
    same_choice(reply, joined_stream(served, path, body), path)

    if path == CHAT:
        texts = [e["token"] for e in reply["logprobs"]["content"]]
    else:
        texts = list(reply["logprobs"]["tokens"])
    stop = texts[2] + texts[3]  # the third token waits as the stop's prefix, the fourth ends it
    assert stop not in "".join(texts[:3]) and len(texts) == 6
    body["stop"] = stop
    cut = served.post(path, **body)["choices"][0]
    assert cut["finish_reason"] == "stop"
    if path == CHAT:
        assert cut["message"]["content"] == "".join(texts[:2])
        assert cut["logprobs"]["content"] == reply["logprobs"]["content"][:4]
    else:
        assert cut["text"] == "".join(texts[:2])
        assert cut["logprobs"] == {k: v[:4] for k, v in reply["logprobs"].items()}
    same_choice(cut, joined_stream(served, path, body), path)
