"""Steering state across requests and restarts: hooks never outlive a request; state persists.

In process, so the model's hook tables can be counted: after a steered
request succeeds or fails, every decoder layer has exactly the hooks it had
before. A restart (a new Server on the same data directory) finds the
profiles, the active profile, the attachments and their live values again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.transformers import TransformersEngine
from miserver.settings import Settings
from miserver.steering.source import RequestSource
from tests.conftest import MODEL_ID, SAE_ID, LocalClient

pytestmark = pytest.mark.model

HELLO: list[Any] = [{"role": "user", "content": "Tell me about your favourite place."}]
LAYER = 12


def chat(client: TestClient, **extra: Any) -> Any:
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 8, "temperature": 0, **extra}
    return client.post("/v1/chat/completions", json=body)


def hook_counts(server: Server) -> list[int]:
    resident = server.state.manager.resident
    assert resident is not None
    engine = resident.engine
    assert isinstance(engine, TransformersEngine)
    return [len(layer._forward_hooks) for layer in engine.model.model.layers]


@pytest.fixture
def server(steer_settings: Settings) -> Iterator[tuple[Server, TestClient]]:
    app = Server(steer_settings)
    with LocalClient(app, raise_server_exceptions=False) as client:
        assert client.post("/api/steering/attachments", json={"sae_id": SAE_ID}).status_code == 201
        yield app, client


def test_no_hook_is_left_after_success_or_error(
    server: tuple[Server, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #4 acceptance (no hook left after success and error), OAI-INL-03."""
    app, client = server
    before = hook_counts(app)
    plain = chat(client).json()["choices"][0]["message"]["content"]
    inline = {"features": [{"index": 5, "strength": 150.0}]}
    assert chat(client, steering=inline).status_code == 200
    assert hook_counts(app) == before

    calls = {"n": 0}
    vector = RequestSource.vector

    def failing(self: RequestSource, layer: int) -> Any:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("injected fault in a steering hook")
        return vector(self, layer)

    monkeypatch.setattr(RequestSource, "vector", failing)
    failed = chat(client, steering=inline)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
    monkeypatch.undo()
    assert hook_counts(app) == before
    again = chat(client)
    assert again.headers["X-miLLM-Steering"] == "none"
    assert again.json()["choices"][0]["message"]["content"] == plain


def test_state_survives_a_restart(steer_settings: Settings) -> None:
    """Issue #4 acceptance: profiles survive a restart; so do the active profile and the
    attachments with their live values (DECISIONS: SQLite in the data dir)."""
    profile = {"sae_id": SAE_ID, "layer": LAYER, "features": [{"index": 7, "strength": 20.0}]}
    with LocalClient(Server(steer_settings), raise_server_exceptions=False) as client:
        client.post("/api/steering/attachments", json={"sae_id": SAE_ID})
        client.post("/api/steering/attachments", json={"sae_id": SAE_ID, "layer": 6})
        values = {"features": [{"index": 3, "strength": 12.5}]}
        client.put(f"/api/steering/attachments/{SAE_ID}/6/features", json=values)
        client.put("/api/profiles/humör", json={**profile, "intensity": 0.5})
        client.put("/api/steering/active-profile", json={"name": "humör"})
        state = client.get("/api/steering").json()
        header = chat(client).headers["X-miLLM-Steering"]
    assert "profile;name=" in header and "manual;" in header
    with LocalClient(Server(steer_settings), raise_server_exceptions=False) as client:
        again = client.get("/api/steering").json()
        assert again["attachments"] == state["attachments"]
        assert again["active_profile"] == "humör" and again["steering"] == state["steering"]
        assert client.get("/api/profiles/humör").json()["intensity"] == 0.5
        assert chat(client).headers["X-miLLM-Steering"] == header


def test_an_operator_change_mid_generation_wins_and_leaves_no_hook(
    server: tuple[Server, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #4 acceptance (no hook left after a concurrent operator change), OAI-CONC-01/02,
    OAI-HDR-03: the change lands between two forward passes of a steered request."""
    app, client = server
    before = hook_counts(app)
    live = app.state.steering
    calls = {"n": 0}
    vector = RequestSource.vector

    def operator_acts(self: RequestSource, layer: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the third forward pass: the operator sets live values
            live.set_manual(MODEL_ID, SAE_ID, LAYER, {9: 40.0})
        return vector(self, layer)

    monkeypatch.setattr(RequestSource, "vector", operator_acts)
    response = chat(client, steering={"features": [{"index": 5, "strength": 30.0}]})
    monkeypatch.undo()
    assert response.status_code == 200
    header = response.headers["X-miLLM-Steering"]
    assert header.startswith("manual;") and header.endswith(";changed")
    assert hook_counts(app) == before
    assert live.attachments(MODEL_ID)[0].manual == {9: 40.0}  # not reverted (OAI-CONC-02)
    assert chat(client).headers["X-miLLM-Steering"] == header.removesuffix(";changed")


def test_an_unreadable_state_is_unknown(
    server: tuple[Server, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-GRAM-07, OAI-GRAM-31: a state that cannot be read is `unknown`, never omitted."""
    _, client = server

    def broken(_self: RequestSource) -> str:
        raise RuntimeError("injected: the applied state cannot be read")

    monkeypatch.setattr(RequestSource, "header", broken)
    response = chat(client)
    assert response.status_code == 200
    assert response.headers["X-miLLM-Steering"] == "unknown;reason=read_failed"
