"""The one error shape every refusal has (OpenAI's), checked whole; and that a refusal loaded
nothing."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient


def error_of(response: Any, status: int, code: str, param: str | None) -> dict[str, Any]:
    """`response` is `status` with `{"error": {message, type, param, code}}` naming `code`
    and `param` and saying why; the error object is returned for further checks."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    assert body["error"]["param"] == param
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def assert_nothing_loaded(client: TestClient) -> None:
    assert client.app.state.manager.resident is None  # type: ignore[attr-defined]
