"""The security model over real HTTP: uvicorn on loopback, one rule per test (REQ-003 SEC).

Each server runs in a thread of this process (`serving`, tests/servers.py), with no model
preloaded, so a start takes a fraction of a second; only the SSE test loads
the embedded GGUF. The start-up refusals themselves are unit tests
(tests/unit/test_security_rules.py); here one `miserver serve` is refused for real.
"""

from __future__ import annotations

import hmac
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import JSON
from tests.e2e.conftest import free_port, serve_command
from tests.errors import error_of
from tests.security_headers import REQUIRED_HEADERS
from tests.servers import KEY, Running, serving, settings_in

PROFILE = b'{"sae_id": "s", "layer": 1, "features": []}'
DEV_ORIGIN = "http://localhost:5173"
CAP = 8_388_608  # LOC-SEC-67: bodies are capped at 8 MiB (8,388,608 bytes)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The default: loopback, no key; the launch model is the embedded GGUF (loaded on demand)."""
    with serving(settings_in(tmp_path_factory.mktemp("sec-local"))) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Loopback with a key file (trailing blanks and line breaks) and one --allow-origin."""
    folder = tmp_path_factory.mktemp("sec-keyed")
    key_file = folder / "key"
    key_file.write_text(f"{KEY}  \n\n")
    settings = settings_in(folder, api_key_file=key_file, allow_origin=(DEV_ORIGIN,))
    with serving(settings) as running:
        yield running


@pytest.fixture
def client(local: Running) -> Iterator[httpx.Client]:
    with local.client() as client:
        yield client


def assert_secured(response: httpx.Response) -> None:
    """LOC-SEC-36..39: the four headers, each exactly once with exactly the value REQ-003
    gives (tests/security_headers.py); LOC-SEC-23: no CORS header."""
    for name, value in REQUIRED_HEADERS.items():
        assert response.headers.get_list(name) == [value], name
    assert not [name for name in response.headers if name.lower().startswith("access-control-")]


# --- Host (DNS rebinding) ---------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.2", "[::2]"])
@pytest.mark.parametrize("path", ["/v1/models", "/", "/api/profiles"])
def test_a_dns_rebinding_host_is_refused(
    client: httpx.Client, local: Running, host: str, path: str
) -> None:
    """LOC-SEC-17: bound to loopback, a Host that is not a loopback name gets 403, on any path."""
    response = client.get(path, headers={"Host": host.format(port=local.port)})
    error_of(response, 403, "forbidden_host", "Host")
    assert_secured(response)


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LocalHost"]
)
def test_loopback_host_names_are_answered(client: httpx.Client, local: Running, host: str) -> None:
    """LOC-SEC-17: localhost, 127.0.0.1 and [::1], with or without port (any letter case)."""
    assert (
        client.get("/v1/models", headers={"Host": host.format(port=local.port)}).status_code == 200
    )


def test_a_network_bind_has_no_host_check_but_needs_the_key(tmp_path: Path) -> None:
    """LOC-SECN-06, LOC-SEC-03: beyond loopback any Host is answered; the key stands in for it."""
    settings = settings_in(tmp_path, host="0.0.0.0", api_key=KEY)
    with serving(settings) as running, running.client(Host="my-box.lan:8000") as client:
        error_of(client.get("/v1/models"), 401, "invalid_api_key", "Authorization")
        answered = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert answered.status_code == 200


# --- Origin and Sec-Fetch-Site -------------------------------------------------------------


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}"]
)
def test_a_foreign_origin_is_refused_whatever_the_method(
    client: httpx.Client, local: Running, origin: str
) -> None:
    """LOC-SEC-18: an Origin other than the server's own is 403, GET included."""
    headers = {"Origin": origin.format(port=local.port), **JSON}
    for response in (
        client.get("/v1/models", headers=headers),
        client.post("/api/cancel", headers=headers),
        client.put("/api/steering/active-profile", json={"name": None}, headers=headers),
    ):
        error_of(response, 403, "forbidden_origin", "Origin")
        assert_secured(response)


@pytest.mark.parametrize("site", ["cross-site", "same-site", "Cross-Site"])
def test_a_cross_site_fetch_without_origin_is_refused(client: httpx.Client, site: str) -> None:
    """LOC-SEC-19, LOC-SEC-20: no Origin and Sec-Fetch-Site cross-site or same-site is 403."""
    response = client.get("/v1/models", headers={"Sec-Fetch-Site": site})
    error_of(response, 403, "forbidden_origin", "Sec-Fetch-Site")


@pytest.mark.parametrize("site", ["same-origin", "none", None])
def test_a_same_origin_or_typed_fetch_passes(client: httpx.Client, site: str | None) -> None:
    """LOC-SEC-21, LOC-SECN-01: same-origin, none (a typed URL) or no header at all pass."""
    headers = {"Sec-Fetch-Site": site} if site else {}
    assert client.get("/v1/models", headers=headers).status_code == 200
    assert client.post("/api/cancel", headers={**headers, **JSON}).status_code == 200


def test_the_servers_own_origin_passes(client: httpx.Client, local: Running) -> None:
    """LOC-SEC-22: Origin = http:// + the request's Host passes (open point 11)."""
    own = {"Origin": local.url, "Sec-Fetch-Site": "same-origin"}
    assert client.get("/v1/models", headers=own).status_code == 200
    by_name = {"Host": f"localhost:{local.port}", "Origin": f"http://localhost:{local.port}"}
    assert client.post("/api/cancel", headers={**by_name, **JSON}).status_code == 200


def test_allow_origin_admits_exactly_one_more_origin(keyed: Running) -> None:
    """LOC-SEC-24: --allow-origin admits its origin; every other foreign origin is still 403."""
    with keyed.client(Authorization=f"Bearer {KEY}") as client:
        admitted = client.get("/v1/models", headers={"Origin": DEV_ORIGIN})
        assert admitted.status_code == 200
        assert_secured(admitted)
        for other in ("http://localhost:5174", "https://localhost:5173", "http://evil.example"):
            error_of(
                client.get("/v1/models", headers={"Origin": other}),
                403,
                "forbidden_origin",
                "Origin",
            )


def test_no_response_carries_a_cors_header(client: httpx.Client, local: Running) -> None:
    """LOC-SEC-23: not a preflight, not a refusal, not a plain answer; OPTIONS on /api and
    /v1 is 405 with or without a JSON content type (open point 9)."""
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization",
    }
    responses = [
        client.options(
            "/v1/chat/completions", headers={"Origin": "http://evil.example", **preflight}
        ),
        client.options("/v1/chat/completions", headers={"Origin": local.url, **preflight}),
        client.options("/v1/models"),
        client.request("OPTIONS", "/v1/models", headers=JSON),
        client.options("/"),
        client.get("/v1/models", headers={"Origin": local.url}),
    ]
    assert [r.status_code for r in responses] == [403, 405, 405, 405, 404, 200]
    for response in responses:
        assert_secured(response)


# --- Headers on every response -------------------------------------------------------------


def test_every_response_carries_the_security_headers(client: httpx.Client, local: Running) -> None:
    """LOC-SEC-36, LOC-SEC-37, LOC-SEC-38, LOC-SEC-39: exactly the CSP REQ-003 writes out,
    nosniff, no-referrer and DENY (literals, tests/security_headers.py) on answers, errors,
    refusals and an event stream (a streamed chat on the embedded GGUF)."""
    model = local.app.launch_model_id()
    responses = [
        client.get("/v1/models"),
        client.get("/"),
        client.get("/v1/nothing-here"),
        client.delete("/v1/models", headers=JSON),
        client.post("/v1/chat/completions", json={"model": model}),
        client.post("/api/cancel"),
        client.get("/v1/models", headers={"Origin": "http://evil.example"}),
    ]
    assert [r.status_code for r in responses] == [200, 200, 404, 405, 400, 415, 403]
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "data: [DONE]" in stream.read().decode()
    for response in [*responses, stream]:
        assert_secured(response)


# --- The API key --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/models", "/api/profiles", "/api/steering"])
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer"]
)
def test_a_missing_or_wrong_key_is_401(
    keyed: Running, path: str, authorization: str | None
) -> None:
    """LOC-SEC-05, LOC-SEC-06, LOC-SECN-04: 401 with WWW-Authenticate: Bearer, loopback too."""
    headers = {"Authorization": authorization} if authorization is not None else {}
    with keyed.client(**headers) as client:
        response = client.get(path)
    error_of(response, 401, "invalid_api_key", "Authorization")
    assert response.headers.get_list("WWW-Authenticate") == ["Bearer"]
    assert KEY not in response.text
    assert_secured(response)


def test_the_right_key_passes(keyed: Running) -> None:
    """LOC-SEC-05, LOC-SEC-12, LOC-SEC-13: the key file's key (trailing blanks and line breaks
    dropped) passes on /v1 and /api, the scheme in any letter case."""
    with keyed.client(Authorization=f"Bearer {KEY}") as client:
        assert client.get("/v1/models").status_code == 200
        assert client.get("/api/profiles").status_code == 200
        assert client.post("/api/cancel", headers=JSON).status_code == 200
    with keyed.client(Authorization=f"bearer {KEY}") as client:
        assert client.get("/v1/models").status_code == 200


def test_paths_outside_the_api_need_no_key(keyed: Running) -> None:
    """LOC-SEC-08, LOC-GEN-02: only /api/* and /v1/* need the key: the UI's page, script
    and stylesheet are served without it from the API's own host and port, and any other
    path outside the API is a plain 404."""
    with keyed.client() as client:
        for path, media in (
            ("/", "text/html"),
            ("/ui/main.js", "text/javascript"),
            ("/ui/app.css", "text/css"),
        ):
            page = client.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith(media)
            assert_secured(page)
            assert client.head(path).content == b""
        for path in ("/index.html", "/app.js", "/ui/other.js", "/apix", "/v1x/models"):
            error_of(client.get(path), 404, "not_found", None)
        error_of(client.get("/v1"), 401, "invalid_api_key", "Authorization")


def test_the_key_is_compared_in_constant_time(
    keyed: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LOC-SEC-07: hmac.compare_digest decides, on the bytes sent and the key."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    with keyed.client(Authorization="Bearer wrong") as client:
        assert client.get("/v1/models").status_code == 401
    with keyed.client(Authorization=f"Bearer {KEY}") as client:
        assert client.get("/v1/models").status_code == 200
    assert calls == [(b"wrong", KEY.encode()), (KEY.encode(), KEY.encode())]


def test_no_key_means_no_authentication(client: httpx.Client) -> None:
    """LOC-GEN-07, OAI-INTEG-04: without a key nothing is asked, and any Authorization is ignored
    (the OpenAI SDK's api_key="not-needed")."""
    assert client.get("/v1/models").status_code == 200
    assert (
        client.get("/v1/models", headers={"Authorization": "Bearer not-needed"}).status_code == 200
    )


# --- Content-Type -------------------------------------------------------------------------


@pytest.fixture
def spied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Running, list[str]]]:
    """A server whose PUT /api/profiles/{name} handler records each call (and creates nothing)."""
    from starlette.responses import JSONResponse

    calls: list[str] = []

    async def put_profile(name: str, body: dict[str, Any]) -> JSONResponse:
        calls.append(name)
        return JSONResponse({"spied": True})

    monkeypatch.setattr("miserver.handlers.profiles.put_profile", put_profile)
    with serving(settings_in(tmp_path)) as running:
        yield running, calls


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
        "application/json-seq",
        "application/json; charset=latin-1",
        None,
    ],
)
def test_a_form_or_other_type_is_415_before_any_handler(
    spied: tuple[Running, list[str]], content_type: str | None
) -> None:
    """LOC-SEC-26, LOC-SEC-27, LOC-GEN-20: 415 and no side effect: the handler never runs."""
    running, calls = spied
    headers = {"Content-Type": content_type} if content_type else {}
    with running.client(**headers) as client:
        response = client.put("/api/profiles/p", content=PROFILE)
        error_of(response, 415, "unsupported_media_type", "Content-Type")
        assert calls == []
        assert client.get("/api/profiles").json()["data"] == []
    with running.client() as client:  # the same request as JSON reaches the handler
        assert client.put("/api/profiles/p", content=PROFILE, headers=JSON).json() == {
            "spied": True
        }
    assert calls == ["p"]


def test_every_post_put_and_delete_needs_json_even_without_a_body(client: httpx.Client) -> None:
    """LOC-GEN-19, LOC-GEN-20: body or no body; GET needs none."""
    error_of(client.post("/api/cancel"), 415, "unsupported_media_type", "Content-Type")
    error_of(client.delete("/api/profiles/p"), 415, "unsupported_media_type", "Content-Type")
    error_of(client.delete("/api/profiles/p", headers=JSON), 404, "profile_not_found", "name")
    assert client.get("/api/profiles").status_code == 200


@pytest.mark.parametrize(
    "content_type",
    ["Application/JSON; charset=utf-8", "application/json", 'application/json;charset="UTF-8"'],
)
def test_json_in_any_letter_case_with_a_charset_passes(
    client: httpx.Client, content_type: str
) -> None:
    """LOC-SEC-25, LOC-GEN-21: any case, a charset parameter; an empty body is no body."""
    response = client.post("/api/cancel", headers={"Content-Type": content_type})
    assert response.status_code == 200 and response.json() == {"cancelled": False}


# --- Body cap -----------------------------------------------------------------------------


def test_a_chunked_body_over_8_mib_is_413(client: httpx.Client) -> None:
    """LOC-SEC-67: a body with no declared length is counted while read; past 8 MiB, 413."""

    def chunks() -> Iterator[bytes]:
        for _ in range(9):
            yield b" " * (1024 * 1024)

    response = client.post("/v1/chat/completions", content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers  # it went chunked
    error_of(response, 413, "payload_too_large", None)
    assert_secured(response)


def test_a_declared_length_over_8_mib_is_413(client: httpx.Client) -> None:
    """LOC-SEC-67: a Content-Length over 8,388,608 bytes is refused unread."""
    response = client.post("/v1/chat/completions", content=b" " * (9 * 1024 * 1024), headers=JSON)
    error_of(response, 413, "payload_too_large", None)


def capped_chat(size: int) -> bytes:
    """A chat body naming no loaded model, padded with blanks to `size` bytes."""
    body = b'{"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}'
    return body + b" " * (size - len(body))


def test_a_body_of_exactly_8_mib_is_read(client: httpx.Client) -> None:
    """LOC-SEC-67: the cap is 8,388,608 bytes; a body that long reaches the app, declared
    or chunked."""
    padded = capped_chat(CAP)

    def chunks() -> Iterator[bytes]:
        yield padded

    for content in (padded, chunks()):
        response = client.post("/v1/chat/completions", content=content, headers=JSON)
        error_of(response, 404, "model_not_found", "model")


def test_one_byte_over_8_mib_is_413(client: httpx.Client) -> None:
    """LOC-SEC-67: 8,388,609 bytes, the cap and one, is refused, declared or chunked."""
    padded = capped_chat(CAP + 1)

    def chunks() -> Iterator[bytes]:
        yield padded[:CAP]
        yield padded[CAP:]

    for content in (padded, chunks()):
        response = client.post("/v1/chat/completions", content=content, headers=JSON)
        error_of(response, 413, "payload_too_large", None)
        assert_secured(response)


# --- Start-up -----------------------------------------------------------------------------


def test_serve_beyond_loopback_without_a_key_refuses_to_start(tmp_path: Path) -> None:
    """LOC-SEC-02: `miserver serve --host 0.0.0.0` exits non-zero, says why, nothing listens."""
    port = free_port()
    command = [*serve_command(), "serve", "--host", "0.0.0.0", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "data")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and "--api-key-file" in done.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
