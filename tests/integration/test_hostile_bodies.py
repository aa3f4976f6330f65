"""The two families of hostile body that were 500s, and duplicates: 400 before any work.

Issue 24: 2,000 nested arrays or 50,000 nested objects on the chat,
completions, embeddings and config routes raised RecursionError; a lone
surrogate in a chat message failed in the tokenizer, on both engines; a
name given twice was taken silently. A fault of the text (depth, a name
twice) is `invalid_json` (`invalid_request` on /api); a fault of one value
(a lone surrogate) is `invalid_parameter` naming it. The full corpus is
tests/e2e/test_hostile.py; the reader's rules are tests/unit/test_body.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, JSON, MODEL_ID, LocalClient, cache_dir
from tests.errors import assert_nothing_loaded, error_of

DEEP_ARRAYS = b'{"model": "m", "messages": ' + b"[" * 2000 + b"]" * 2000 + b"}"
DEEP_OBJECTS = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
ROUTES = [
    ("POST", "/v1/chat/completions", "invalid_json"),
    ("POST", "/v1/completions", "invalid_json"),
    ("POST", "/v1/embeddings", "invalid_json"),
    ("PUT", "/api/config", "invalid_request"),
]
LONE = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The default engine, loaded: llama.cpp on SmolLM2's GGUF."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("hostile-gguf"),
        cache_dir=cache_dir(),
        model=GGUF_ID,
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "code"), ROUTES, ids=[r[1] for r in ROUTES])
@pytest.mark.parametrize("raw", [DEEP_ARRAYS, DEEP_OBJECTS], ids=["arrays-2000", "objects-50000"])
def test_deep_nesting_is_a_400_naming_the_body_before_any_work(
    bare_client: TestClient, method: str, path: str, code: str, raw: bytes
) -> None:
    """Issue 24 (was 500), OAI-ERR-01, LOC-GEN-14: nothing loads, the config is unchanged."""
    config = bare_client.get("/api/config").json()
    response = bare_client.request(method, path, content=raw, headers=JSON)
    error = error_of(response, 400, code, "body")
    assert "64 levels" in error["message"]
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert_nothing_loaded(bare_client)
    assert bare_client.get("/api/config").json() == config


@pytest.mark.parametrize("engine", ["transformers", "gguf"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_lone_surrogate_in_a_message_is_a_400_on_both_engines(
    request: pytest.FixtureRequest, engine: str, stream: bool
) -> None:
    """Issue 24 (was 500 from the tokenizer): the string's path is named, and the engine
    still answers the same greedy request afterwards."""
    client: TestClient = request.getfixturevalue("client" if engine == "transformers" else "gguf")
    model = MODEL_ID if engine == "transformers" else GGUF_ID
    greedy = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi \U0001f600"}],
        "max_tokens": 6,
        "temperature": 0,
    }
    before = client.post("/v1/chat/completions", json=greedy).json()["choices"][0]["message"]
    raw = LONE % model.encode()
    if stream:
        raw = raw[:-1] + b', "stream": true}'
    response = client.post("/v1/chat/completions", content=raw, headers=JSON)
    error_of(response, 400, "invalid_parameter", "messages[0].content")
    after = client.post("/v1/chat/completions", json=greedy).json()["choices"][0]["message"]
    assert after == before


@pytest.mark.parametrize(
    ("method", "path", "raw", "code", "param"),
    [
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "nope", "messages": [], "max_tokens": 3, "max_tokens": 5}',
            "invalid_json",
            "max_tokens",
        ),
        (
            "PUT",
            "/api/config",
            b'{"ctx-size": 512, "ctx-size": 1024}',
            "invalid_request",
            "ctx-size",
        ),
        (
            "POST",
            "/v1/embeddings",
            b'{"model": "m", "input": [{"a": 1, "a": 2}]}',
            "invalid_json",
            "input[0].a",
        ),
    ],
    ids=["chat-max-tokens", "config", "embeddings-nested"],
)
def test_a_name_given_twice_is_a_400_naming_it_before_validation(
    bare_client: TestClient, method: str, path: str, raw: bytes, code: str, param: str
) -> None:
    """Issue 24: the last duplicate no longer wins; the body is refused before the model
    (`nope` would be a 404) or the schema (empty `messages`) is looked at."""
    config = bare_client.get("/api/config").json()
    error_of(bare_client.request(method, path, content=raw, headers=JSON), 400, code, param)
    assert bare_client.get("/api/config").json() == config
    assert_nothing_loaded(bare_client)


def test_get_requests_are_not_read_as_json(bare_client: TestClient) -> None:
    """A GET carries no API body: one sent anyway is not parsed, so it cannot be refused."""
    response = bare_client.request("GET", "/v1/models", content=b"[[[[", headers=JSON)
    assert response.status_code == 200


def test_the_depth_limit_follows_the_setting(settings: Settings) -> None:
    """JSON_MAX_DEPTH: a body 9 levels deep passes the reader at 9 (the schema then
    refuses its `content`), and is refused as too deep at 8."""
    raw = b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 6 + b"]" * 6
    raw += b"}]}"
    for depth, param in ((9, "messages[0].content[0]"), (8, "body")):
        server = Server(replace(settings, json_max_depth=depth), preload=False)
        with LocalClient(server, raise_server_exceptions=False) as client:
            response = client.post("/v1/chat/completions", content=raw, headers=JSON)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param, response.text


@pytest.mark.parametrize(
    ("method", "target", "param"),
    [
        ("PUT", "/api/profiles/%FF", "path"),
        ("DELETE", "/api/profiles/%ED%A0%80", "path"),
        ("GET", "/v1/models/a%C3", "path"),
        ("GET", "/api/models?dir=%80", "query"),
    ],
    ids=["lone-byte", "encoded-surrogate", "cut-sequence", "query"],
)
def test_a_target_that_is_not_utf8_is_a_400_and_names_no_resource(
    bare_client: TestClient, method: str, target: str, param: str
) -> None:
    """Issue 24: percent-escapes that do not decode to UTF-8 were read as U+FFFD, so
    `/api/profiles/%FF` and `/api/profiles/%80` named one profile; now 400 invalid_request."""
    body = b'{"sae_id": "s", "layer": 1, "features": []}' if method == "PUT" else None
    response = bare_client.request(method, target, content=body, headers=JSON)
    error_of(response, 400, "invalid_request", param)
    assert bare_client.get("/api/profiles").json()["data"] == []
