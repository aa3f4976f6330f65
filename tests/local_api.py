"""The local /api driven through a TestClient: a config change, a load and its wait.

`configure(client, **values)` puts config values (each accepted); `load(client,
model)` asks for a load and waits until the session is ready; `wait_until(client,
done)` polls GET /api/info until `done(info)` holds or the time is up.
"""

from __future__ import annotations

import time
from typing import Any, cast

from starlette.testclient import TestClient

from tests.conftest import JSON, LocalClient


def wait_until(client: LocalClient, done: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, Any] = client.get("/api/info").json()
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def configure(client: TestClient, **values: Any) -> dict[str, Any]:
    response = client.put("/api/config", json={"values": values}, headers=JSON)
    assert response.status_code == 200 and not response.json()["rejected"], response.text
    return cast(dict[str, Any], response.json())


def load(client: TestClient, model: str) -> dict[str, Any]:
    assert client.post("/api/session/load", json={"model": model}, headers=JSON).status_code == 202
    info = wait_until(client, lambda found: found["state"] in ("ready", "error"))
    assert info["state"] == "ready", info
    return info
