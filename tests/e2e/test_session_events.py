"""The session API and live events over real HTTP: /api/info, load, unload, cancel, events."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL_ID
from tests.e2e.conftest import LiveServer, live_server
from tests.events import DONE_KEYS, Events

JSON = {"Content-Type": "application/json"}
USER = [{"role": "user", "content": "Write a long story about a dragon."}]
TOKEN_KEYS = {"step", "steps", "wall_ms", "compute_ms", "cpu_ms", "rss_mib", "mem_available_mib"}


@pytest.fixture(scope="module")
def session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own: these tests unload and load its model."""
    with live_server(tmp_path_factory.mktemp("e2e-session")) as running:
        yield running


@pytest.fixture(scope="module")
def api(session_server: LiveServer) -> str:
    return session_server.base_url.removesuffix("/v1") + "/api"


def chat(session_server: LiveServer, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(f"{session_server.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def info(api: str) -> dict[str, Any]:
    response = httpx.get(f"{api}/info", timeout=10)
    assert response.status_code == 200
    found: dict[str, Any] = response.json()
    return found


def test_info_describes_the_ready_session(api: str) -> None:
    """LOC-INFO-01, -02, -05, -06, -10, -12, -13, -14, -16, -17, -19: the loaded model's facts."""
    found = info(api)
    assert found["state"] == "ready" and found["error"] == "" and found["generating"] is False
    assert found["version"] and found["overlap_available"] is False
    assert set(found["host"]) == {"ram_total_mib", "ram_available_mib", "cpu_threads"}
    model = found["model"]
    assert model["id"] == MODEL_ID and model["engine"] == "transformers"
    assert model["arch"] == "llama" and model["n_ctx"] == 8192 and model["streaming"] is False
    assert model["compute_threads"] >= 1 and model["load_s"] >= 0


def test_events_see_state_tokens_and_done_for_a_real_chat(
    api: str, session_server: LiveServer
) -> None:
    """LOC-EVENTS-01, -02, -04, -05, -06, -07, -12, -13, LOC-INFO-19: `state` on connect,
    one `token` per generated token, one `done` per generation, `generating` in states."""
    with Events(api.removesuffix("/api")) as events:
        assert events.content_type.startswith("text/event-stream")
        assert events.headers["x-frame-options"] == "DENY"  # LOC-SEC-36..39 on streams too
        assert "frame-ancestors 'none'" in events.headers["content-security-policy"]
        assert events.named("state")[0]["state"] == "ready"
        reply = chat(session_server, 6)
        events.wait_for(lambda _: events.named("done"))
        events.wait_for(lambda _: not events.named("state")[-1]["generating"])
    tokens = events.named("token")
    assert len(tokens) == reply["usage"]["completion_tokens"] == 6
    assert [t["step"] for t in tokens] == [1, 2, 3, 4, 5, 6]
    assert all(set(t) >= TOKEN_KEYS and t["steps"] == 6 for t in tokens)
    (done,) = events.named("done")
    assert set(done) >= DONE_KEYS
    assert done["cancelled"] is False and done["tokens"] == 6
    assert done["n_past"] == done["n_prompt"] + 6
    assert any(s["generating"] for s in events.named("state"))


def test_cancel_stops_the_running_generation(api: str, session_server: LiveServer) -> None:
    """LOC-CANCEL-01..04: cancel ends the chat at the next token with "cancelled", and its
    `done` event says so; cancel answers 200 also when nothing runs."""
    with Events(api.removesuffix("/api")) as events:
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(chat(session_server, 400)))
        worker.start()
        events.wait_for(lambda _: len(events.named("token")) >= 3)
        response = httpx.post(f"{api}/cancel", headers=JSON, timeout=10)
        assert response.status_code == 200 and response.json() == {"cancelled": True}
        worker.join(60)
        events.wait_for(lambda _: events.named("done"))
    assert result["choices"][0]["finish_reason"] == "cancelled"
    assert result["usage"]["completion_tokens"] < 400
    assert events.named("done")[0]["cancelled"] is True
    idle = httpx.post(f"{api}/cancel", headers=JSON, timeout=10)
    assert idle.status_code == 200 and idle.json() == {"cancelled": False}


def test_unload_then_load_moves_the_state(api: str) -> None:
    """LOC-UNLOAD-02, -03, LOC-LOAD-01, -03, -05, -06, LOC-INFO-07, -09, -13, LOC-EVENTS-26:
    unload empties
    the session; a body-less load answers 202 and ends `ready`, announced by state events."""
    with Events(api.removesuffix("/api")) as events:
        response = httpx.post(f"{api}/session/unload", headers=JSON, timeout=60)
        assert response.status_code == 200 and response.json() == {"ok": True, "unloaded": True}
        events.wait_for(lambda _: events.named("state")[-1]["state"] == "empty")
        assert info(api)["state"] == "empty" and info(api)["model"] is None
        response = httpx.post(f"{api}/session/load", headers=JSON, timeout=60)
        assert response.status_code == 202 and response.json() == {"model": MODEL_ID}
        events.wait_for(lambda _: events.named("state")[-1]["state"] == "ready", timeout=120)
    states = [s["state"] for s in events.named("state")]
    assert "loading" in states[states.index("empty") :]
    logs = events.named("log")  # LOC-EVENTS-26: the server's own diagnostics
    assert any("closed" in log["message"] and log["level"] == "info" for log in logs), logs
    assert info(api)["model"]["id"] == MODEL_ID


def test_load_names_a_model_and_refuses_unknown_ones(api: str) -> None:
    """LOC-LOAD-04, -07: a named model loads; an unknown one is refused before anything
    changes (404 model_not_found), and an empty name is a 400."""
    missing = httpx.post(f"{api}/session/load", headers=JSON, json={"model": "nope"}, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    empty = httpx.post(f"{api}/session/load", headers=JSON, json={"model": ""}, timeout=10)
    assert empty.status_code == 400
    assert info(api)["state"] == "ready"
    named = httpx.post(f"{api}/session/load", headers=JSON, json={"model": MODEL_ID}, timeout=10)
    assert named.status_code == 202
    deadline = time.monotonic() + 120
    while info(api)["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert info(api)["model"]["id"] == MODEL_ID
