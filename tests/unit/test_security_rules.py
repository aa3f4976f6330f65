"""The security model's pure rules: start-up refusals, the CLI's exit, header parsing."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from miserver import cli
from miserver.access import (
    AccessPolicy,
    StartRefused,
    access_policy,
    is_loopback,
    normalize_origin,
    read_key_file,
)
from miserver.http.security import bearer, host_name, is_json, secured
from miserver.settings import Settings, add_flags, documented, from_args, from_env
from tests.security_headers import REQUIRED_HEADERS

SECRET = "k3y-never-logged"


def refusal(**changes: Any) -> str:
    with pytest.raises(StartRefused) as refused:
        access_policy(Settings(**changes))
    return str(refused.value)


# --- Start-up rules -----------------------------------------------------------------------


def test_the_default_is_loopback_with_no_key() -> None:
    """LOC-GEN-05, LOC-GEN-07: 127.0.0.1, no authentication, nothing to warn about."""
    assert access_policy(Settings()) == AccessPolicy(loopback=True)


def test_no_environment_variable_widens_the_bind() -> None:
    """LOC-SEC-01: --host is the only way; MISERVER_HOST (or any HOST variable) is not read."""
    assert from_env({"MISERVER_HOST": "0.0.0.0", "HOST": "0.0.0.0"}).host == "127.0.0.1"
    assert [env for name, env, _, _ in documented() if name == "host"] == [None]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "my-box.lan"])
def test_beyond_loopback_without_a_key_is_refused(host: str) -> None:
    """LOC-SEC-02: a non-loopback --host needs a key or --no-api-key."""
    message = refusal(host=host)
    assert "--api-key-file" in message and "--no-api-key" in message


def test_beyond_loopback_with_a_key_starts_and_warns() -> None:
    """LOC-SEC-03, open point 12: every non-loopback bind is warned about."""
    policy = access_policy(Settings(host="0.0.0.0", api_key=SECRET))
    assert not policy.loopback and policy.key == SECRET.encode()
    assert policy.warning is not None and "in clear" in policy.warning


def test_no_api_key_starts_an_open_server_with_a_warning() -> None:
    """LOC-SEC-04: --no-api-key is the open server on purpose, with a stronger warning."""
    policy = access_policy(Settings(host="0.0.0.0", no_api_key=True))
    assert policy.key is None and not policy.loopback
    assert policy.warning is not None and "OPEN server" in policy.warning


def test_the_key_file_drops_trailing_line_breaks_and_blanks(tmp_path: Path) -> None:
    """LOC-SEC-12, LOC-SEC-13."""
    path = tmp_path / "key"
    path.write_bytes(f"{SECRET} \t\r\n\n  \n".encode())
    assert read_key_file(path) == SECRET.encode()
    assert access_policy(Settings(api_key_file=path)).key == SECRET.encode()


@pytest.mark.parametrize("content", [b"", b"\n", b"  \r\n\t\n"])
def test_an_empty_key_file_refuses_the_start(tmp_path: Path, content: bytes) -> None:
    """LOC-SEC-14: empty after stripping."""
    path = tmp_path / "key"
    path.write_bytes(content)
    assert "is empty" in refusal(api_key_file=path)


@pytest.mark.parametrize("content", [b"two words", b"line\nbreak", b" leading", "clé".encode()])
def test_a_key_no_client_can_send_refuses_the_start(tmp_path: Path, content: bytes) -> None:
    """A bearer key is printable ASCII without blanks; anything else could never match."""
    path = tmp_path / "key"
    path.write_bytes(content)
    assert "printable ASCII" in refusal(api_key_file=path)


def test_a_missing_key_file_refuses_the_start(tmp_path: Path) -> None:
    assert "--api-key-file" in refusal(api_key_file=tmp_path / "absent")


def test_both_key_options_refuse_the_start(tmp_path: Path) -> None:
    """LOC-SEC-15, LOC-SEC-16: --api-key alone works; with --api-key-file it is refused."""
    path = tmp_path / "key"
    path.write_text(SECRET)
    assert access_policy(Settings(api_key=SECRET)).key == SECRET.encode()
    assert "both" in refusal(api_key_file=path, api_key=SECRET)
    assert "both" in refusal(api_key_file=path, api_key=SECRET, host="0.0.0.0")


def test_no_api_key_with_a_key_refuses_the_start() -> None:
    assert "--no-api-key" in refusal(api_key=SECRET, no_api_key=True)
    assert "is empty" in refusal(api_key="")


def test_the_key_is_in_no_repr() -> None:
    """The key never reaches a log through a settings or policy repr."""
    settings = Settings(host="0.0.0.0", api_key=SECRET)
    assert SECRET not in repr(settings)
    assert SECRET not in repr(access_policy(settings))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("localhost.example", False),
    ],
)
def test_which_bind_is_loopback(host: str, loopback: bool) -> None:
    """LOC-SEC-02, open point 13: 127.0.0.0/8, ::1 and localhost are loopback."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://localhost:5173", "http://localhost:5173"),
        ("http://LocalHost:5173/", "http://localhost:5173"),
        ("https://ui.example:443", "https://ui.example"),
        ("http://[::1]:3000", "http://[::1]:3000"),
    ],
)
def test_allow_origin_is_kept_as_a_browser_writes_it(url: str, origin: str) -> None:
    """LOC-SEC-24: compared with Origin as browsers serialize it."""
    assert normalize_origin(url) == origin
    assert access_policy(Settings(allow_origin=(url,))).allowed_origins == {origin}


@pytest.mark.parametrize(
    "url", ["localhost:5173", "http://x/app", "ftp://x", "http://x?q=1", "http://u@x", "http://x:y"]
)
def test_an_allow_origin_that_is_no_origin_refuses_the_start(url: str) -> None:
    assert "--allow-origin" in refusal(allow_origin=(url,))


def test_the_security_flags() -> None:
    """Switches, a repeatable --allow-origin, and --models-only stored for later use."""
    parser = argparse.ArgumentParser()
    add_flags(parser)
    argv = ["--host", "0.0.0.0", "--no-api-key", "--models-only"]
    argv += ["--allow-origin", "http://a:1", "--allow-origin", "http://b:2"]
    settings = from_args(parser.parse_args(argv), Settings())
    assert settings.host == "0.0.0.0" and settings.no_api_key and settings.models_only
    assert settings.allow_origin == ("http://a:1", "http://b:2")
    plain = from_args(parser.parse_args([]), Settings())
    assert (plain.no_api_key, plain.models_only, plain.allow_origin) == (False, False, ())


# --- The CLI ------------------------------------------------------------------------------


@pytest.fixture
def uvicorn_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """uvicorn.run and Server replaced: what `serve` would listen with, nothing started."""
    runs: list[dict[str, Any]] = []

    class FakeServer:
        def __init__(self, settings: Settings, *, policy: AccessPolicy, flags: Any = None) -> None:
            self.policy = policy

        def launch_model_id(self) -> str:
            return "m"

    def run(app: Any, **options: Any) -> None:
        runs.append(options)

    monkeypatch.setattr("miserver.app.Server", FakeServer)
    monkeypatch.setattr("uvicorn.run", run)
    return runs


def serve(*argv: str) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", *argv])
    return int(exited.value.code or 0)


def test_serve_refuses_with_exit_2_and_listens_on_nothing(
    uvicorn_runs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """LOC-SEC-02: exit status 2, the reason logged, uvicorn never started."""
    with caplog.at_level(logging.ERROR, "miserver"):
        assert serve("--host", "0.0.0.0") == 2
    assert uvicorn_runs == []
    assert "refusing to start" in caplog.text and "--no-api-key" in caplog.text


def test_serve_warns_for_an_open_server_and_trusts_no_forwarding_header(
    uvicorn_runs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """LOC-SEC-04, LOC-SEC-65: the warning is logged; uvicorn gets proxy_headers=False."""
    with caplog.at_level(logging.WARNING, "miserver"):
        assert serve("--host", "0.0.0.0", "--port", "9123", "--no-api-key") == 0
    assert "OPEN server" in caplog.text
    [options] = uvicorn_runs
    assert (options["host"], options["port"], options["proxy_headers"]) == ("0.0.0.0", 9123, False)


def test_serve_never_logs_the_key(
    uvicorn_runs: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        assert serve("--host", "0.0.0.0", "--api-key", SECRET) == 0
        assert serve("--api-key", SECRET, "--no-api-key") == 2
    assert len(uvicorn_runs) == 1 and caplog.text and SECRET not in caplog.text


# --- Header rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("localhost", "localhost"),
        ("LOCALHOST:8000", "localhost"),
        ("127.0.0.1:1", "127.0.0.1"),
        ("[::1]:8000", "[::1]"),
        ("[::1]", "[::1]"),
        ("evil.example:8000", "evil.example"),
        ("localhost:8000:1", None),
        ("[::1]x", None),
    ],
)
def test_host_names(value: str, name: str | None) -> None:
    """LOC-SEC-17: the name a Host header carries, port dropped."""
    assert host_name(value) == name


@pytest.mark.parametrize(
    ("value", "json"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ('application/json;charset="UTF-8"', True),
        ("application/json;", True),
        ("application/json; charset=latin-1", False),
        ("application/json; boundary=x", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("text/plain", False),
        ("application/jsonx", False),
        (None, False),
    ],
)
def test_json_media_types(value: str | None, json: bool) -> None:
    """LOC-SEC-25, LOC-SEC-26: any letter case, a charset parameter allowed (UTF-8: JSON's)."""
    assert is_json(value) is json


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("Bearer abc", b"abc"),
        ("bearer abc", b"abc"),
        ("Bearer  abc ", b"abc"),
        ("Basic abc", b""),
        ("abc", b""),
        (None, b""),
    ],
)
def test_bearer_tokens(value: str | None, token: bytes) -> None:
    """LOC-SEC-05: the scheme in any case (RFC 7235); anything else presents no key."""
    assert bearer(value) == token


def test_secured_sets_the_headers_exactly_and_drops_cors() -> None:
    """LOC-SEC-23, LOC-SEC-36, LOC-SEC-37, LOC-SEC-38, LOC-SEC-39: whatever the app sent, the
    four headers with the values REQ-003 gives (literals), one value each, no Access-Control-*."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"access-control-allow-origin", b"*"),
            (b"Access-Control-Allow-Credentials", b"true"),
            (b"x-frame-options", b"SAMEORIGIN"),
            (b"content-type", b"application/json"),
        ],
    }
    asyncio.run(secured(send)(start))
    expected = [(k.lower().encode(), v.encode()) for k, v in REQUIRED_HEADERS.items()]
    assert sorted(sent[0]["headers"]) == sorted([(b"content-type", b"application/json"), *expected])
