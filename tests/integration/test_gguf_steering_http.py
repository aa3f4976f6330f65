"""Steering a GGUF model through the HTTP surface (issue 46, contract 0.25.0): the embedded
default model on llama.cpp, the trained SAE attached to it, steered by every source the
transformers engine takes (inline, a profile and its dial, an active profile, live values)
with the same X-miLLM-Steering statement and hash, and the epoch rules (OAI-CONC-01/02).

Contract 0.25.0 supersedes OAI-INL-24 (steering on GGUF refused): the GGUF column of the
field matrix honours `steering`, `profile` and `steering_intensity` where the engine steers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from miserver.steering.source import RequestSource
from tests.conftest import ENGINE_THREADS, GGUF_ID, SAE_ID, LocalClient, cache_dir
from tests.errors import error_of
from tests.steering_http import (
    LAYER,
    STEERING,
    USER,
    activate,
    attach,
    inline,
    inline_value,
    manual_value,
    profile_value,
    put_profile,
    reset,
    set_values,
    steering_of,
    text,
)

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
PAIRS = {5: 80.0}  # moves SmolLM2's greedy reply from its second token (test_llamacpp_steering)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[TestClient]:
    """The embedded GGUF (the default model) with the SAEs dir, loaded, nothing attached."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("gguf-steer"),
        cache_dir=cache_dir(),
        saes_dir=saes_dir,
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        assert chat(client).status_code == 200  # loads it: SAEs attach to the resident model
        yield client


@pytest.fixture(autouse=True)
def clean(server: TestClient) -> Iterator[None]:
    reset(server)
    yield
    reset(server)


def chat(client: TestClient, **extra: Any) -> Any:
    body = {"model": GGUF_ID, "messages": USER, "max_tokens": 8, "temperature": 0, **extra}
    return client.post(CHAT, json=body)


def test_inline_steering_runs_and_says_so(server: TestClient) -> None:
    """Issue 46 (supersedes OAI-INL-24), OAI-HDR-01, OAI-HASH-01 on GGUF: the SAE attaches to
    the GGUF model, an inline request changes the greedy text and its header is the inline
    member with the set's hash, as on transformers; the next unsteered request is plain."""
    plain = text(chat(server))
    assert attach(server)["attachment"]["model"] == GGUF_ID
    steered = chat(server, steering=inline(PAIRS))
    assert steering_of(steered) == inline_value(PAIRS)
    assert text(steered) != plain
    again = chat(server)
    assert again.headers[STEERING] == "none" and text(again) == plain


def test_profiles_their_dial_and_live_values_steer_gguf(server: TestClient) -> None:
    """OAI-PROF, OAI-DIAL, OAI-CONC-03 on GGUF: a profile per request and its dial, an
    active profile and live values each steer, and each header names its source."""
    attach(server)
    put_profile(server, "p")
    assert steering_of(chat(server, profile="p")) == profile_value("p", "request", 1.0)
    dialled = chat(server, profile="p", steering_intensity=0.5)
    assert steering_of(dialled) == profile_value("p", "request", 0.5)
    activate(server, "p")
    assert steering_of(chat(server)) == profile_value("p", "active", 1.0)
    activate(server, None)
    set_values(server, PAIRS)
    assert steering_of(chat(server)) == manual_value(PAIRS)


def test_an_operator_change_mid_generation_wins(
    server: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-CONC-01, OAI-CONC-02, OAI-HDR-03 on GGUF: live values set between two passes of an
    inline-steered request reach its next pass; its header states them, `changed`; they stay
    after it."""
    attach(server)
    live = server.app.state.steering  # type: ignore[attr-defined]
    calls = {"n": 0}
    vector = RequestSource.vector

    def operator_acts(self: RequestSource, layer: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the third pass: the operator sets live values
            live.set_manual(GGUF_ID, SAE_ID, LAYER, {9: 40.0})
        return vector(self, layer)

    monkeypatch.setattr(RequestSource, "vector", operator_acts)
    response = chat(server, steering=inline(PAIRS))
    monkeypatch.undo()
    header = steering_of(response)
    assert header == f"{manual_value({9: 40.0})};changed"
    assert live.attachments(GGUF_ID)[0].manual == {9: 40.0}
    assert steering_of(chat(server)) == manual_value({9: 40.0})


def test_layer_zero_cannot_attach(server: TestClient) -> None:
    """llama.cpp's control vector has no slot for layer 0: attaching there is a 400 naming
    `layer`, and nothing is attached."""
    body = {"sae_id": SAE_ID, "layer": 0}
    error = error_of(
        server.post("/api/steering/attachments", json=body), 400, "invalid_parameter", "layer"
    )
    assert "layers 1..29" in error["message"]
    assert server.get("/api/steering").json()["attachments"] == []


def test_activations_on_gguf(server: TestClient) -> None:
    """Contract 0.26.0 (supersedes OAI-ACT-24), OAI-ACT-05: `return_sae_activations` on the
    GGUF model with the SAE attached reads a row per position fed, each with its top
    features, as on transformers."""
    attach(server)
    ask = {"positions": "all", "top_k": 3}
    response = chat(server, return_sae_activations=ask)
    assert response.status_code == 200, response.text
    body = response.json()
    reading = body["millm"]["sae_activations"]
    fed = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] - 1
    assert len(reading["positions"]) == fed
    assert all(len(p["features"]) <= 3 for p in reading["positions"])
    assert any(p["features"] for p in reading["positions"])
