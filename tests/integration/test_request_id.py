"""`x-request-id` over real HTTP: on every response, in the logs and in /api/events.

A client's `X-Request-Id` that is a sane token (1-128 of [A-Za-z0-9._:-]) is
echoed; none, or anything else, gets a fresh `req_<32 hex>`. The servers run
under uvicorn in this process (tests/servers.py: `serving`);
the event-stream test loads the embedded GGUF, the log-record test uses the
session's transformers model.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from miserver.request_context import RequestIdFilter
from tests.conftest import JSON, MODEL_ID
from tests.events import Events
from tests.servers import KEY, Running, serving, settings_in

FRESH = re.compile(r"req_[0-9a-f]{32}")
SANE = "trace-01.a:B_c"
INSANE = ["has space", "x" * 129, "semi;colon", 'quote"d', ""]
HI = [{"role": "user", "content": "Hi"}]
OVER_CAP = 8_388_608 + 1  # LOC-SEC-67: bodies are capped at 8 MiB (8,388,608 bytes)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Loopback, no key; its launch model is the embedded GGUF (loaded on demand)."""
    with serving(settings_in(tmp_path_factory.mktemp("rid-local"))) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("rid-keyed")
    (folder / "key").write_text(KEY)
    with serving(settings_in(folder, api_key_file=folder / "key")) as running:
        yield running


def _cases(local: Running, keyed: Running) -> dict[str, tuple[Running, Callable[..., Any]]]:
    """name -> (server, a request sent with extra headers) of one refusal or error each."""
    model = local.app.launch_model_id()
    chat = {"model": model, "messages": HI, "max_tokens": 1}

    def post(body: Any, **headers: str) -> Callable[[httpx.Client], httpx.Response]:
        def send(client: httpx.Client) -> httpx.Response:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return client.post("/v1/chat/completions", content=content, headers=headers)

        return send

    return {
        "400": (local, post({**chat, "temperature": 5}, **JSON)),
        "401": (keyed, post(chat, **JSON)),
        "403": (local, lambda c: c.get("/v1/models", headers={"Host": "evil.example"})),
        "404": (local, post({**chat, "model": "no-such-model"}, **JSON)),
        "413": (local, post(b" " * OVER_CAP, **JSON)),
        "415": (local, post(chat, **{"Content-Type": "text/plain"})),
    }


STATUS = {"400": 400, "401": 401, "403": 403, "404": 404, "413": 413, "415": 415}


@pytest.mark.parametrize("case", sorted(STATUS))
def test_refusals_and_errors_carry_the_id(local: Running, keyed: Running, case: str) -> None:
    """OAI-ERR-01, LOC-SEC-05, LOC-SEC-17, LOC-SEC-25, LOC-SEC-67: a refusal of the security
    middleware or an error of the API echoes a sane X-Request-Id, and gets a fresh id for
    none or an insane one (never echoed as sent)."""
    server, send = _cases(local, keyed)[case]
    seen = []
    for sent in [SANE, None, *INSANE]:
        headers = {} if sent is None else {"X-Request-Id": sent}
        with server.client(**headers) as client:
            response = send(client)
        assert response.status_code == STATUS[case], response.text
        assert set(response.json()) == {"error"}
        [rid] = response.headers.get_list("x-request-id")
        assert rid == SANE if sent == SANE else FRESH.fullmatch(rid), (sent, rid)
        seen.append(rid)
    assert len(set(seen)) == len(seen)  # every fresh id is new


def test_a_stream_its_events_and_its_log_share_the_id(local: Running) -> None:
    """LOC-EVENTS-26, OAI-STREAM-01, OAI-VALID-07: an SSE response echoes the id; its `token`
    and `done` events on /api/events and the `log` event of its ignored-field warning carry
    it; a plain reply with no id gets a fresh one."""
    model = local.app.launch_model_id()
    body = {"model": model, "messages": HI, "max_tokens": 3, "temperature": 0, "user": "u"}
    with Events(local.url) as events, local.client(**{"X-Request-Id": SANE}) as client:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as sse:
            assert sse.status_code == 200
            assert sse.headers["content-type"].startswith("text/event-stream")
            assert "data: [DONE]" in sse.read().decode()
        assert sse.headers.get_list("x-request-id") == [SANE]
        events.wait_for(lambda seen: any(name == "done" for name, _ in seen))
        mine = [(name, data) for name, data in events.seen if data.get("request_id") == SANE]
    names = [name for name, _ in mine]
    assert names.count("token") == 3 and names.count("done") == 1, names
    assert any(
        name == "log" and "request_fields_unused" in data["message"] for name, data in mine
    ), mine
    with local.client() as client:
        plain = client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert plain.status_code == 200 and FRESH.fullmatch(plain.headers["x-request-id"])


@pytest.mark.model
def test_log_records_carry_the_id(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    """OAI-VALID-07: the warning logged for an ignored field is a record with `request_id`,
    the id the response carries (a handler with RequestIdFilter writes it)."""
    caplog.handler.addFilter(RequestIdFilter())
    body = {"model": MODEL_ID, "messages": HI, "max_tokens": 1, "temperature": 0, "user": "u"}
    with caplog.at_level(logging.WARNING, "miserver"):
        echoed = client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": SANE})
        fresh = client.post("/v1/chat/completions", json=body)
    assert echoed.headers["x-request-id"] == SANE
    ids = [
        getattr(r, "request_id", None)
        for r in caplog.records
        if r.getMessage().startswith("request_fields_unused")
    ]
    assert ids == [SANE, fresh.headers["x-request-id"]]
