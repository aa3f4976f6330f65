"""`POST /api/decide` and `POST /api/cancel` on the real SmolLM2 (transformers)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.base import ChatPrompt, Decision
from miserver.engines.transformers import TransformersEngine
from miserver.local.decisions import answer
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, LocalClient, cache_dir
from tests.errors import error_of

pytestmark = pytest.mark.model

PREFIX = "You are choosing the next action for a careful assistant. " * 12
KEYS = [
    "cancelled",
    "best",
    "choice_logp",
    "n_tokens",
    "n_reused",
    "n_prefilled",
    "restore_s",
    "store_s",
    "prefill_s",
    "prefill_cpu_s",
    "prefill_read_mib",
    "prefill_io_s",
    "prefill_stall_s",
    "prefill_mgmt_s",
    "prefill_dev_tokens",
    "prefill_dev_read_mib",
    "prefill_dev_stall_s",
    "prefill_dev_routed",
    "prefill_dev_demand",
    "prefix_state_mib",
]


def decide(client: TestClient, suffix: str, **extra: Any) -> Any:
    body = {"prefix": PREFIX, "suffix": suffix, "choices": ["yes", "no", "maybe"], **extra}
    return client.post("/api/decide", json=body)


def engine_of(client: TestClient) -> TransformersEngine:
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    assert isinstance(engine, TransformersEngine)
    return engine


def test_a_decision_reads_first_token_logprobs_over_the_whole_vocabulary(
    client: TestClient,
) -> None:
    """LOC-DECIDE-01/03/04/05/07/13/15/16/17/18/20/21: one prefill of the templated user
    message; choice_logp is log_softmax over the vocabulary, not renormalised; every key."""
    response = decide(client, "\nIs the sky blue? Answer yes or no.", reuse_prefix=False)
    assert response.status_code == 200, response.text
    got = response.json()
    assert list(got) == KEYS
    engine = engine_of(client)
    message = {"role": "user", "content": PREFIX + "\nIs the sky blue? Answer yes or no."}
    ids = engine.render_chat(ChatPrompt((message,), {"enable_thinking": False}))
    with torch.inference_mode():
        logits = engine.model(torch.tensor([ids])).logits[0, -1].double()
    table = torch.log_softmax(logits, -1)
    firsts = [engine.tokenize(c, add_special_tokens=False)[0] for c in ("yes", "no", "maybe")]
    assert got["choice_logp"] == pytest.approx([float(table[i]) for i in firsts], abs=1e-4)
    assert sum(math.exp(lp) for lp in got["choice_logp"]) < 1.0
    assert got["best"] == max(range(3), key=lambda i: got["choice_logp"][i])
    assert got["n_tokens"] == len(ids) == got["n_reused"] + got["n_prefilled"]  # LOC-DECIDE-14
    assert not got["cancelled"] and got["prefill_dev_tokens"] == 0


def test_the_prefix_state_is_kept_and_restored(client: TestClient) -> None:
    """LOC-DECIDE-02/06/14/16: reuse_prefix defaults to true; a prompt extending the kept
    prefix prefills only the rest, with the same answer as a cold prefill."""
    cold = decide(client, "\nIs grass green?", reuse_prefix=False).json()
    assert cold["n_reused"] == 0 and cold["prefix_state_mib"] == 0.0
    first = decide(client, "\nIs water wet?").json()
    assert first["prefix_state_mib"] > 0
    warm = decide(client, "\nIs grass green?").json()
    assert warm["n_reused"] > 100 and warm["n_prefilled"] < cold["n_prefilled"]
    assert warm["n_tokens"] == cold["n_tokens"] == warm["n_reused"] + warm["n_prefilled"]
    assert warm["choice_logp"] == pytest.approx(cold["choice_logp"], abs=1e-4)
    assert warm["best"] == cold["best"]
    decide(client, "\nIs the sea salty?", reuse_prefix=False)  # leaves the kept state alone
    assert decide(client, "\nIs fire hot?").json()["n_reused"] == warm["n_reused"]


def test_refusals(client: TestClient) -> None:
    """LOC-DECIDE-08/09/10: a shared first token, an empty list, a prompt past the context."""
    body = {"prefix": "Pick.", "suffix": "", "choices": ["yes", "yes please"]}
    error = error_of(client.post("/api/decide", json=body), 400, "invalid_request", "choices[1]")
    assert "choices[0]" in error["message"]
    body["choices"] = []
    error_of(client.post("/api/decide", json=body), 400, "invalid_request", "choices")
    body = {"prefix": "word " * 9000, "suffix": "", "choices": ["a"]}
    error_of(client.post("/api/decide", json=body), 400, "context_length_exceeded", "prefix")


def test_no_model_loaded_is_503(bare_client: TestClient) -> None:
    """LOC-DECIDE-11."""
    body = {"prefix": "Pick.", "suffix": "", "choices": ["a", "b"]}
    error_of(bare_client.post("/api/decide", json=body), 503, "no_model", None)


def test_cancel_always_answers_200(bare_client: TestClient) -> None:
    """LOC-CANCEL-02: also when nothing runs."""
    response = bare_client.post("/api/cancel", headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json() == {"cancelled": False}


def test_a_cancelled_decision_stops_between_prefill_chunks(client: TestClient) -> None:
    """LOC-DECIDE-22: a cancel lands between prefill chunks; the answer says cancelled."""
    engine = engine_of(client)
    ids, prefix = engine.render_split(PREFIX, "\nWhich?")
    cancel = threading.Event()
    cancel.set()
    decision = engine.prefill_choices(ids, prefix, [1, 2], reuse=True, cancel=cancel)
    assert decision.cancelled and decision.n_prefilled == 0 and decision.logps == ()
    assert answer(decision)["best"] is None


def test_minus_infinity_is_null_and_best_skips_it() -> None:
    """LOC-DECIDE-19, LOC-DECIDE-21."""
    decision = Decision(
        cancelled=False,
        logps=(None, -2.0, -0.5),
        n_tokens=3,
        n_reused=0,
        n_prefilled=3,
        restore_s=0.0,
        store_s=0.0,
        prefill_s=0.1,
        prefill_cpu_s=0.1,
        prefix_state_mib=0.0,
    )
    got = answer(decision)
    assert got["choice_logp"] == [None, -2.0, -0.5] and got["best"] == 2


@pytest.fixture(scope="module")
def gguf_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The default server: SmolLM2's GGUF on llama.cpp."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("decide-gguf"),
        cache_dir=cache_dir(),
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


def test_decide_on_llama_cpp_keeps_its_prefix_state_across_a_chat(gguf_client: TestClient) -> None:
    """LOC-DECIDE-06 on the GGUF engine: the saved prefix state survives a chat turn in
    between and gives the answer a full prefill gives; every key is there."""
    first = decide(gguf_client, "\nIs the sky blue? Answer yes or no.")
    assert first.status_code == 200, first.text
    assert list(first.json()) == KEYS and first.json()["prefix_state_mib"] > 0
    chat = {"model": "SmolLM2-135M-Instruct:Q4_1", "messages": [{"role": "user", "content": "Hi"}]}
    assert gguf_client.post("/v1/chat/completions", json={**chat, "max_tokens": 4}).is_success
    warm = decide(gguf_client, "\nIs grass red? Answer yes or no.").json()
    assert warm["n_reused"] > 100 and warm["n_prefilled"] < 40
    engine = gguf_client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    engine.context.llama.reset()  # nothing to reuse: a full prefill
    cold = decide(gguf_client, "\nIs grass red? Answer yes or no.", reuse_prefix=False).json()
    assert cold["n_reused"] == 0
    # llama.cpp's logits depend on how the tokens were batched (its kernels for one token and
    # for many, flash attention's f16 sums): a reused prefix differs from a full prefill by up
    # to about 0.2 nats on this model (docs/DECISIONS.md, "Flash attention on llama.cpp")
    assert warm["choice_logp"] == pytest.approx(cold["choice_logp"], abs=0.3)
    assert warm["n_tokens"] == cold["n_tokens"] and warm["best"] == cold["best"]
