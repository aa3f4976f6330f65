"""Text completions on the real SmolLM2, in process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.base import Engine
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, MODEL_ID, LocalClient, cache_dir
from tests.errors import assert_nothing_loaded, error_of

CMPL = "/v1/completions"
VOCAB = 49152  # SmolLM2's vocabulary, on both engines


def complete(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "prompt": prompt, **extra}


def test_single_prompt(client: TestClient) -> None:
    """OAI-EP-02, OAI-CMPL-01, OAI-CMPL-04, OAI-CMPL-06: one choice, fingerprint, headers."""
    response = client.post(
        CMPL, json=complete("The capital of France is", temperature=0, max_tokens=6)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["system_fingerprint"].startswith("millm:SmolLM2-135M-Instruct@")
    [choice] = body["choices"]
    assert choice["index"] == 0 and "Paris" in choice["text"]
    assert response.headers["X-miLLM-Steering"] == "none"
    assert response.headers["X-miLLM-Model"] == MODEL_ID


def test_prompt_list_gives_one_choice_each_seeded_separately(client: TestClient) -> None:
    """OAI-CMPL-02, OAI-CMPL-11, OAI-SEED-12: each prompt one choice, each seeded separately."""
    body = client.post(
        CMPL,
        json=complete(
            ["Once upon a time", "Once upon a time", "The sky"],
            temperature=1.0,
            max_tokens=10,
            seed=42,
        ),
    ).json()
    texts = [c["text"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert texts[0] == texts[1]
    alone = client.post(
        CMPL, json=complete("The sky", temperature=1.0, max_tokens=10, seed=42)
    ).json()
    assert alone["choices"][0]["text"] == texts[2]


def test_add_special_tokens_is_honoured(client: TestClient) -> None:
    """OAI-CMPL-05, OAI-TOKIDS-06: accepted; SmolLM2's tokenizer adds no BOS, so counts agree."""
    on = client.post(CMPL, json=complete("Hello", temperature=0, max_tokens=2)).json()
    off = client.post(
        CMPL, json=complete("Hello", temperature=0, max_tokens=2, add_special_tokens=False)
    ).json()
    assert on["usage"]["prompt_tokens"] == off["usage"]["prompt_tokens"] == 1


def test_streamed_completion(client: TestClient) -> None:
    """OAI-CMPL-03, REQ-000 open point 20: text_completion chunks, steering chunk, [DONE]."""
    with client.stream(
        "POST", CMPL, json=complete("One, two,", temperature=0, max_tokens=6, stream=True)
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["millm_steering"] == "none" and chunks[-1]["choices"] == []
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    plain = client.post(CMPL, json=complete("One, two,", temperature=0, max_tokens=6)).json()
    assert text == plain["choices"][0]["text"]


def test_empty_prompt_without_special_tokens_is_refused(client: TestClient) -> None:
    """OAI-CMPL-01: a prompt that tokenizes to nothing cannot be continued (400, names prompt)."""
    response = client.post(CMPL, json=complete("", add_special_tokens=False, max_tokens=2))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"


# -- token-id prompts and `logprobs: false` (issue 15 items 4 and 7) -------------------------

TEXTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server whose launch model is SmolLM2's Q4_1 GGUF on llama.cpp."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("cmpl-gguf") / "data",
        cache_dir=cache_dir(),
        model=GGUF_ID,
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(params=["transformers", "gguf"])
def served(request: pytest.FixtureRequest) -> tuple[TestClient, str, Engine]:
    """(client, model id, resident engine) of each engine in turn."""
    client: TestClient
    if request.param == "gguf":
        client, model = request.getfixturevalue("gguf"), GGUF_ID
    else:
        client, model = request.getfixturevalue("client"), MODEL_ID
    resident = client.app.state.manager.resident  # type: ignore[attr-defined]
    entry, engine = resident.entry, resident.engine
    assert entry.model_id == model
    return client, model, engine


def greedy(client: TestClient, model: str, prompt: Any, **extra: Any) -> dict[str, Any]:
    """A greedy completion's body, taken warm: llama.cpp's first token after a cold prefill
    can differ from one after a cache hit, so the same request runs once before."""
    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 8, **extra}
    for _ in range(2):
        response = client.post(CMPL, json=body)
        assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_a_token_id_prompt_completes_as_its_text(
    served: tuple[TestClient, str, Engine],
) -> None:
    """Issue 15 item 4, OAI-CMPL-01, OAI-CMPL-04, OAI-RESP-07 (both engines): `prompt` as an
    `int[]` is one prompt, sent to the model as it is: the same greedy completion as the
    text that tokenizes to those ids, with `usage.prompt_tokens` its length."""
    client, model, engine = served
    ids = engine.tokenize(TEXTS[0])
    assert len(ids) > 1
    text = greedy(client, model, TEXTS[0])
    tokens = greedy(client, model, ids)
    assert [c["text"] for c in tokens["choices"]] == [c["text"] for c in text["choices"]]
    assert tokens["choices"][0]["text"]
    assert tokens["usage"]["prompt_tokens"] == len(ids) == text["usage"]["prompt_tokens"]
    assert tokens["usage"]["total_tokens"] == len(ids) + tokens["usage"]["completion_tokens"]


def test_token_id_lists_give_one_choice_each(served: tuple[TestClient, str, Engine]) -> None:
    """Issue 15 item 4, OAI-CMPL-02 (both engines): `prompt` as an `int[][]` is one prompt
    per list, as a list of strings is: one choice each in order, each the greedy completion
    of the text those ids stand for; usage counts every id once."""
    client, model, engine = served
    ids = [engine.tokenize(t) for t in TEXTS]
    assert ids[0] != ids[1]
    text = greedy(client, model, TEXTS)
    tokens = greedy(client, model, ids)
    assert [c["index"] for c in tokens["choices"]] == [0, 1]
    assert [c["text"] for c in tokens["choices"]] == [c["text"] for c in text["choices"]]
    assert tokens["choices"][0]["text"] != tokens["choices"][1]["text"]
    assert tokens["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


def test_a_streamed_token_id_prompt_equals_the_plain_reply(client: TestClient) -> None:
    """Issue 15 item 4, OAI-STREAM (transformers): a streamed id prompt gives the same text
    and token counts as the non-streamed one (the second run may reuse the first's prefix)."""
    ids = client.app.state.manager.resident.engine.tokenize(TEXTS[1])  # type: ignore[attr-defined]
    body = complete(ids, temperature=0, max_tokens=6, stream=True)
    body["stream_options"] = {"include_usage": True}
    with client.stream("POST", CMPL, json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    plain = greedy(client, MODEL_ID, ids, max_tokens=6)
    assert text == plain["choices"][0]["text"]
    usage = [c["usage"] for c in chunks if c.get("usage")][-1]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # cached_tokens may differ
    assert {k: usage[k] for k in counts} == {k: plain["usage"][k] for k in counts}


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([[1, 2], [3, VOCAB]], "prompt[1][1]"),
        ([[VOCAB + 100]], "prompt[0][0]"),
        ([1, 2, VOCAB], "prompt[2]"),
    ],
    ids=["int[][]", "int[][]-first", "int[]"],
)
def test_an_id_outside_the_vocabulary_is_named(
    served: tuple[TestClient, str, Engine], prompt: Any, param: str
) -> None:
    """Issue 15 item 4, OAI-ERR-01 (both engines): an id not below the vocabulary size is
    400 invalid_parameter naming it, `prompt[i][j]` in an `int[][]` and `prompt[j]` in an
    `int[]`, before any generation (the model stays resident, nothing is generated)."""
    client, model, engine = served
    assert engine.facts.vocab_size == VOCAB
    for stream in (False, True):
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "stream": stream}
        error = error_of(client.post(CMPL, json=body), 400, "invalid_parameter", param)
        assert str(VOCAB - 1) in error["message"]
    scoring = {"model": model, "prompt": prompt, "max_tokens": 1, "logprobs": 1}
    error_of(client.post(CMPL, json=scoring), 400, "invalid_parameter", param)  # both score


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([5, -1], "prompt[1]"),
        ([[5], [7, 8, -3]], "prompt[1][2]"),
        ([[5], []], "prompt[1]"),
        ([], "prompt"),
        ([[1], "text"], "prompt"),
        ([1.5], "prompt"),
    ],
    ids=["negative-int[]", "negative-int[][]", "empty-id-list", "empty", "mixed", "float"],
)
def test_bad_id_prompts_are_refused_before_any_load(
    bare_client: TestClient, prompt: Any, param: str
) -> None:
    """Issue 15 item 4, OAI-ERR-01: a negative id, an empty id list, an empty `prompt`,
    strings mixed with ids, or a non-integer id is 400 invalid_parameter naming where,
    before any load."""
    body = complete(prompt, max_tokens=2)
    error_of(bare_client.post(CMPL, json=body), 400, "invalid_parameter", param)
    assert_nothing_loaded(bare_client)


def test_logprobs_false_is_no_change(served: tuple[TestClient, str, Engine]) -> None:
    """OAI-VALID-31, REQ-000 open points 12 and 27 (both engines): `logprobs: false` on
    /v1/completions is accepted as a no-change value: the same completion as without it,
    not scoring mode, and not reported in X-miLLM-Ignored-Fields, strict mode included."""
    client, model, _ = served
    plain = greedy(client, model, TEXTS[0])
    body = {"model": model, "prompt": TEXTS[0], "temperature": 0, "max_tokens": 8}
    for strict in ({}, {"X-miLLM-Strict": "1"}):
        response = client.post(CMPL, json={**body, "logprobs": False}, headers=strict)
        assert response.status_code == 200, response.text
        assert "X-miLLM-Ignored-Fields" not in response.headers
        assert response.json()["choices"] == plain["choices"]
        assert response.json()["choices"][0]["logprobs"] is None
    refused = client.post(CMPL, json={**body, "logprobs": True})
    error_of(refused, 400, "invalid_parameter", "logprobs")
    if model == MODEL_ID:  # `logprobs: 0` is an integer: scoring mode (OAI-SCORE-02)
        scored = client.post(CMPL, json={**body, "logprobs": 0, "max_tokens": 1})
        assert scored.status_code == 200, scored.text
        assert scored.json()["choices"][0]["logprobs"]["top_logprobs"] == [{}]


def test_a_scored_token_id_prompt_equals_its_text(client: TestClient) -> None:
    """Issue 15 item 4, OAI-SCORE-01, OAI-SCORE-15, OAI-SCORE-16: scoring a prompt given as
    ids gives the same log-probabilities as its text; `text_offset` is the length of the
    text the ids stand for."""
    ids = client.app.state.manager.resident.engine.tokenize(TEXTS[0])  # type: ignore[attr-defined]
    fields = {"max_tokens": 1, "logprobs": 5, "temperature": 0}
    text = client.post(CMPL, json=complete(TEXTS[0], **fields))
    tokens = client.post(CMPL, json=complete([ids, ids], **fields))
    assert text.status_code == tokens.status_code == 200, tokens.text
    [expected] = text.json()["choices"]
    found = tokens.json()["choices"]
    assert [c["index"] for c in found] == [0, 1]
    for choice in found:
        assert choice["text"] == expected["text"]
        assert choice["logprobs"]["tokens"] == expected["logprobs"]["tokens"]
        assert choice["logprobs"]["text_offset"] == [len(TEXTS[0])]
        for key, value in expected["logprobs"]["top_logprobs"][0].items():
            assert choice["logprobs"]["top_logprobs"][0][key] == pytest.approx(value, abs=1e-6)
    assert tokens.json()["usage"]["prompt_tokens"] == 2 * len(ids)
