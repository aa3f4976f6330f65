"""Anthropic's conventions on the Messages routes (issue 45 item 5, contract 0.22.0), over
real HTTP with the official `anthropic` SDK: its error shape and types at each status,
`x-api-key` as the key, `anthropic-version` accepted, a `request-id` on every answer; the
security model unchanged. The server loads no model: every case here is refused, or
answered, before one would be (tests/servers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from tests.anthropic_reference import AnthropicCheck, client
from tests.conftest import GGUF_ID
from tests.servers import KEY, Running, serving, settings_in

HELLO: Any = [{"role": "user", "content": "Hello"}]
CAP = 8_388_608  # LOC-SEC-67: bodies are capped at 8 MiB


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with serving(settings_in(tmp_path_factory.mktemp("messages-keyed"), api_key=KEY)) as running:
        yield running


@pytest.fixture(scope="module")
def check() -> AnthropicCheck:
    return AnthropicCheck()


def sdk(running: Running, check: AnthropicCheck, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=running.url, api_key=key, max_retries=0, http_client=client(check)
    )


def _error(caught: pytest.ExceptionInfo[anthropic.APIStatusError]) -> dict[str, Any]:
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert caught.value.response.headers["request-id"] == body["request_id"]
    assert body["request_id"] == caught.value.response.headers["x-request-id"]
    error: dict[str, Any] = body["error"]
    return error


def test_a_wrong_key_is_an_authentication_error(keyed: Running, check: AnthropicCheck) -> None:
    """LOC-SEC-03 on /v1/messages: `x-api-key` (the SDK's header) is the key; a wrong one is
    `401 authentication_error`, as is none (the key is checked before anything else)."""
    with (
        sdk(keyed, check, key="wrong") as wrong,
        pytest.raises(anthropic.AuthenticationError) as caught,
    ):
        wrong.messages.create(model=GGUF_ID, max_tokens=4, messages=HELLO)
    error = _error(caught)
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    with httpx.Client() as plain:
        bare = plain.post(f"{keyed.url}/v1/messages/count_tokens", json={"model": GGUF_ID})
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "authentication_error"


def test_refusals_before_any_load_in_anthropics_shape(
    keyed: Running, check: AnthropicCheck
) -> None:
    """With the right `x-api-key` (and `anthropic-version`, which the SDK sends): an unknown
    model is `404 not_found_error`; a missing `max_tokens`, an image block and a server tool
    are `400 invalid_request_error`, each naming its field (`param`, and the message)."""
    with sdk(keyed, check) as client:
        _refused_in_shape(client)


def _refused_in_shape(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    error = _error(missing)
    assert (error["type"], error["code"], error["param"]) == (
        "not_found_error",
        "model_not_found",
        "model",
    )
    image: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            ],
        }
    ]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"messages": HELLO}, "max_tokens"),
        ({"max_tokens": 4, "messages": image}, "messages[0].content[1].type"),
        (
            {
                "max_tokens": 4,
                "messages": HELLO,
                "tools": [{"type": "bash_20250124", "name": "bash"}],
            },
            "tools[0].type",
        ),
        (
            {"max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "tool"}},
            "tool_choice.name",
        ),
    ]
    for body, param in cases:
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.post("/v1/messages", body={"model": GGUF_ID, **body}, cast_to=httpx2.Response)
        error = _error(refused)
        assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        assert param.split("[")[0].split(".")[0] in error["message"]


def test_the_security_model_holds(keyed: Running) -> None:
    """LOC-SEC-25/26, -67 on /v1/messages: a foreign `Origin` is `403 permission_error` even
    with the key; a form post is refused (415, an invalid request); a body over the cap is
    `413 request_too_large`. `Authorization: Bearer` is taken as ever."""
    headers = {"x-api-key": KEY}
    body = {"model": GGUF_ID, "max_tokens": 4, "messages": HELLO}
    foreign = httpx.post(
        f"{keyed.url}/v1/messages", json=body, headers={**headers, "Origin": "https://evil.example"}
    )
    assert foreign.status_code == 403
    assert foreign.json()["error"]["type"] == "permission_error"
    form = httpx.post(f"{keyed.url}/v1/messages", data={"a": "b"}, headers=headers)
    assert form.status_code == 415 and form.json()["error"]["type"] == "invalid_request_error"
    big = httpx.post(
        f"{keyed.url}/v1/messages",
        content=b'{"pad": "' + b"x" * CAP + b'"}',
        headers={**headers, "Content-Type": "application/json"},
    )
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    bearer = httpx.post(
        f"{keyed.url}/v1/messages",
        json={**body, "model": "no-such-model"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert bearer.status_code == 404 and bearer.json()["error"]["type"] == "not_found_error"


def test_other_routes_keep_openais_shape(keyed: Running) -> None:
    """Only the Messages routes speak Anthropic's: /v1/chat/completions errors as before, and
    `x-api-key` is no key there."""
    chat = {"model": "no-such-model", "messages": HELLO}
    answered = httpx.post(
        f"{keyed.url}/v1/chat/completions",
        json=chat,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert answered.status_code == 404
    assert set(answered.json()["error"]) == {"message", "type", "param", "code"}
    unkeyed = httpx.post(f"{keyed.url}/v1/chat/completions", json=chat, headers={"x-api-key": KEY})
    assert unkeyed.status_code == 401
