"""`return_sae_activations` through the HTTP API (OAI-ACT), on the transformers SmolLM2
with the trained SAE attached at its hook layer. The reference is a direct forward of the
token ids the response lists, hooked at the same layer, encoded by the same SAE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import TransformersEngine
from miserver.steering.sae import SAE
from tests.conftest import MODEL_ID, OTHER_SAE_ID, SAE_ID, LocalClient, steering_settings
from tests.engines import direct
from tests.errors import error_of
from tests.events import data_of

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LAYER = 12  # the SAE's hook layer
D_SAE = 2048
USER = [{"role": "user", "content": "Tell me about your favourite place."}]
FIELD = "return_sae_activations"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[TestClient]:
    settings = steering_settings(tmp_path_factory.mktemp("act") / "data", saes_dir)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(autouse=True)
def attached(server: TestClient) -> Iterator[None]:
    """The SAE attached at its hook layer, alone, for every test; nothing left after."""
    for a in server.get("/api/steering").json()["attachments"]:
        server.delete(f"/api/steering/attachments/{a['sae_id']}/{a['layer']}")
    response = server.post("/api/steering/attachments", json={"sae_id": SAE_ID})
    assert response.status_code in (200, 201), response.text
    yield
    for a in server.get("/api/steering").json()["attachments"]:
        server.delete(f"/api/steering/attachments/{a['sae_id']}/{a['layer']}")


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "temperature": 0, **extra}


def expected_top(
    engine: TransformersEngine, sae: SAE, ids: list[int], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of `ids`, the top k (values, indices) of a direct hooked forward."""
    acts = sae.encode(direct(engine, ids, LAYER)).float()
    top = torch.topk(acts, k, dim=1)
    return top.values, top.indices


def assert_matches_direct(
    listed: list[dict[str, Any]],
    fed: list[int],
    reference: TransformersEngine,
    sae: SAE,
    k: int,
) -> None:
    values, _ = expected_top(reference, sae, fed, k)
    for entry in listed:
        got = [f["value"] for f in entry["features"]]
        assert got == pytest.approx(values[entry["position"]].tolist(), rel=1e-3, abs=1e-3)


def test_chat_reply_carries_the_activations_of_every_position_fed(
    server: TestClient, reference: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-ACT-01/02/04/05/06/08/09/12/13/26: `millm.sae_activations` lists every position
    fed (prompt then completion, the last sampled token excluded), each position's token id,
    and the top_k activations a direct forward of those ids at the same layer gives."""
    response = server.post(CHAT, json=chat(**{FIELD: {"positions": "all", "top_k": 5}}))
    assert response.status_code == 200, response.text
    body = response.json()
    reading = body["millm"]["sae_activations"]
    assert (reading["sae_id"], reading["layer"], reading["read_point"]) == (
        SAE_ID,
        LAYER,
        "post_steering",
    )
    assert "not an unsteered counterfactual" in reading["note"]
    usage = body["usage"]
    listed = reading["positions"]
    assert [p["position"] for p in listed] == list(
        range(usage["prompt_tokens"] + usage["completion_tokens"] - 1)
    )
    fed = [p["token_id"] for p in listed]
    assert fed[: usage["prompt_tokens"]] == reference.render_chat(ChatPrompt(tuple(USER)))
    assert all(len(p["features"]) == 5 for p in listed)
    assert_matches_direct(listed, fed, reference, trained_sae, 5)


def test_completion_reads_the_completion_positions(
    server: TestClient, reference: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-ACT-01/03/07: a text completion, `positions: completion` and candidate features:
    the generated positions fed, each listing only candidates."""
    candidates = [1, 5, 9, 300, 2047]
    ask = {"positions": "completion", "top_k": 3, "features": candidates}
    body = {"model": MODEL_ID, "prompt": "The lighthouse keeper", "max_tokens": 6, FIELD: ask}
    response = server.post(COMPLETIONS, json={**body, "temperature": 0})
    assert response.status_code == 200, response.text
    out = response.json()
    usage = out["usage"]
    listed = out["millm"]["sae_activations"]["positions"]
    first = usage["prompt_tokens"]
    assert [p["position"] for p in listed] == list(
        range(first, first + usage["completion_tokens"] - 1)
    )
    for entry in listed:
        assert {f["index"] for f in entry["features"]} <= set(candidates)
        assert len(entry["features"]) == 3


def test_a_stream_ends_with_the_activations_chunk_then_the_steering_chunk(
    server: TestClient,
) -> None:
    """OAI-ACT-14, OAI-STREAM-09, open point 19: one `choices: []` chunk with `millm`, after
    the finish chunk, before the `millm_steering` chunk and [DONE]."""
    body = chat(stream=True, **{FIELD: {"positions": "last", "top_k": 2}})
    with server.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        events = data_of(list(response.iter_lines()))
    assert events[-1] == "[DONE]"
    last, activations, finish = events[-2], events[-3], events[-4]
    assert "millm_steering" in last and "millm" not in last
    assert activations["choices"] == [] and set(activations["millm"]) == {"sae_activations"}
    assert len(activations["millm"]["sae_activations"]["positions"]) == 1
    assert finish["choices"][0]["finish_reason"] is not None
    assert all("millm" not in e for e in events[:-3] if isinstance(e, dict))


def test_no_millm_key_when_not_asked(server: TestClient) -> None:
    """OAI-ACT-15: a reply, and every chunk of a stream, without `millm` unless asked."""
    response = server.post(CHAT, json=chat())
    assert response.status_code == 200 and "millm" not in response.json()
    with server.stream("POST", CHAT, json=chat(stream=True)) as stream:
        events = data_of(list(stream.iter_lines()))
    assert all("millm" not in e for e in events if isinstance(e, dict))


def test_pre_steering_reads_before_this_layers_delta(server: TestClient) -> None:
    """OAI-ACT-09/10: under steering at this layer, pre_steering and post_steering differ at
    the prompt's last position; without steering they are the same."""

    def last_prompt(read_point: str, steering: dict[str, Any] | None) -> dict[str, Any]:
        extra: dict[str, Any] = {FIELD: {"positions": "prompt", "read_point": read_point}}
        if steering is not None:
            extra["steering"] = steering
        response = server.post(CHAT, json=chat(max_tokens=1, **extra))
        assert response.status_code == 200, response.text
        reading = response.json()["millm"]["sae_activations"]
        assert reading["read_point"] == read_point
        return dict(reading["positions"][-1])

    steering = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 80.0}]}
    assert last_prompt("pre_steering", None) == last_prompt("post_steering", None)
    pre, post = last_prompt("pre_steering", steering), last_prompt("post_steering", steering)
    assert pre == last_prompt("pre_steering", None)  # only this layer's delta removed
    assert pre != post
    assert 3 in {f["index"] for f in post["features"]}  # steered along it, it fires


def test_scoring_reads_unsteered(server: TestClient) -> None:
    """OAI-ACT-11: in scoring mode the read point is `unsteered`, X-miLLM-Steering: none."""
    body = chat(max_tokens=1, logprobs=True, top_logprobs=2, **{FIELD: {"positions": "all"}})
    response = server.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    assert response.headers["X-miLLM-Steering"] == "none"
    reading = response.json()["millm"]["sae_activations"]
    assert reading["read_point"] == "unsteered"
    assert len(reading["positions"]) == response.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        pytest.param({"n": 2}, "n", id="OAI-ACT-16"),
        pytest.param({"extra_messages": [USER]}, "extra_messages", id="OAI-ACT-17"),
        pytest.param({FIELD: {"sae_id": "nope"}}, f"{FIELD}.sae_id", id="OAI-ACT-19"),
        pytest.param({FIELD: {"features": [D_SAE]}}, f"{FIELD}.features[0]", id="OAI-ACT-21"),
        pytest.param({FIELD: {"top_k": 65}}, f"{FIELD}.top_k", id="OAI-ACT-22"),
        pytest.param(
            {FIELD: {"positions": "completion", "top_k": 64}, "max_tokens": 1025},
            FIELD,
            id="OAI-ACT-23",
        ),
    ],
)
def test_refusals_before_anything_is_generated(
    server: TestClient, extra: dict[str, Any], param: str
) -> None:
    """OAI-ACT-16..23: 400 invalid_parameter naming the field, nothing generated."""
    body = {FIELD: {"top_k": 2}, **chat(), **extra}
    error_of(server.post(CHAT, json=body), 400, "invalid_parameter", param)


def test_a_prompt_list_is_refused(server: TestClient) -> None:
    """OAI-ACT-18: several prompts have no single position axis."""
    body = {"model": MODEL_ID, "prompt": ["a", "b"], FIELD: {"top_k": 2}}
    error_of(server.post(COMPLETIONS, json=body), 400, "invalid_parameter", "prompt")


def test_several_saes_attached_and_none_named_is_refused_naming_them(
    server: TestClient,
) -> None:
    """OAI-ACT-20: the error names the candidates; naming one serves."""
    response = server.post("/api/steering/attachments", json={"sae_id": OTHER_SAE_ID})
    assert response.status_code in (200, 201), response.text
    error = error_of(
        server.post(CHAT, json=chat(**{FIELD: {"top_k": 2}})),
        400,
        "invalid_parameter",
        f"{FIELD}.sae_id",
    )
    assert SAE_ID in error["message"] and OTHER_SAE_ID in error["message"]
    named = server.post(CHAT, json=chat(**{FIELD: {"top_k": 2, "sae_id": OTHER_SAE_ID}}))
    assert named.status_code == 200, named.text
    assert named.json()["millm"]["sae_activations"]["sae_id"] == OTHER_SAE_ID
