"""Steering through the HTTP surface, for tests: the /api calls that attach SAEs, set live
values and store or activate profiles, the steering fields of a request, and the
X-miLLM-Steering values a response should carry (tests/integration/test_steering_requests.py,
test_gguf_steering_http.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette.testclient import TestClient

from miserver.steering import steering_set_hash
from miserver.steering.header import parse
from tests.conftest import JSON, SAE_ID

LAYER = 12  # the SAE's hook layer
STEERING = "X-miLLM-Steering"
USER = [{"role": "user", "content": "Tell me about your favourite place."}]
STORED = {3: 40.0, 17: -12.5}  # a profile's stored strengths (×2 stays inside ±200)


def reset(client: TestClient) -> None:
    """No active profile, nothing attached, no profile stored."""
    assert client.put("/api/steering/active-profile", json={"name": None}).status_code == 200
    for a in client.get("/api/steering").json()["attachments"]:
        assert client.delete(
            f"/api/steering/attachments/{a['sae_id']}/{a['layer']}", headers=JSON
        ).is_success
    for p in client.get("/api/profiles").json()["data"]:
        assert client.delete(profile_path(p["name"]), headers=JSON).status_code == 200


def text(response: Any) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def steering_of(response: Any) -> str:
    """X-miLLM-Steering of a 200, checked against the grammar (OAI-GRAM-01)."""
    assert response.status_code == 200, response.text
    [value] = response.headers.get_list(STEERING)  # one header per request (OAI-INL-28)
    parse(value)
    return str(value)


def features(pairs: dict[int, float]) -> list[dict[str, Any]]:
    return [{"index": i, "strength": s} for i, s in pairs.items()]


def inline(pairs: dict[int, float], sae_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"features": features(pairs)}
    if sae_id is not None:
        body["sae_id"] = sae_id
    return body


def attach(client: TestClient, sae_id: str = SAE_ID, layer: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"sae_id": sae_id} if layer is None else {"sae_id": sae_id, "layer": layer}
    )
    response = client.post("/api/steering/attachments", json=body)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


def values_path(sae_id: str = SAE_ID, layer: int = LAYER) -> str:
    return f"/api/steering/attachments/{sae_id}/{layer}/features"


def set_values(
    client: TestClient, pairs: dict[int, float], sae_id: str = SAE_ID, layer: int = LAYER
) -> dict[str, Any]:
    response = client.put(values_path(sae_id, layer), json={"features": features(pairs)})
    assert response.status_code == 200, response.text
    return dict(response.json())


def profile_path(name: str) -> str:
    return f"/api/profiles/{quote(name, safe='')}"


def put_profile(
    client: TestClient,
    name: str,
    pairs: dict[int, float] | None = None,
    sae_id: str = SAE_ID,
    layer: int = LAYER,
    **extra: Any,
) -> Any:
    body = {"sae_id": sae_id, "layer": layer, "features": features(pairs or STORED), **extra}
    return client.put(profile_path(name), json=body)


def activate_raw(client: TestClient, name: str | None) -> Any:
    return client.put("/api/steering/active-profile", json={"name": name})


def activate(client: TestClient, name: str | None) -> dict[str, Any]:
    response = activate_raw(client, name)
    assert response.status_code == 200, response.text
    return dict(response.json())


def state(client: TestClient) -> dict[str, Any]:
    return dict(client.get("/api/steering").json())


def applied(pairs: dict[int, float], scale: float = 1.0) -> dict[int, float]:
    """What the hook applies: clamp(strength × scale, ±200), zeros dropped (OAI-HASH-03..06)."""
    out = {i: max(-200.0, min(200.0, s * scale)) for i, s in pairs.items()}
    return {i: s for i, s in out.items() if s != 0.0}


def sae_params(sae_id: str, layer: int, pairs: dict[int, float], scale: float = 1.0) -> str:
    hashed = steering_set_hash(sae_id, list(applied(pairs, scale).items()))
    return f'sae="{sae_id}";layer={layer};features={len(applied(pairs, scale))};hash="{hashed}"'


def inline_value(
    pairs: dict[int, float], sae_id: str = SAE_ID, layer: int = LAYER, clamped: int = 0
) -> str:
    tail = f";clamped={clamped}" if clamped else ""
    return f"inline;{sae_params(sae_id, layer, pairs)}{tail}"


def manual_value(
    pairs: dict[int, float], sae_id: str = SAE_ID, layer: int = LAYER, scale: float = 1.0
) -> str:
    return f"manual;{sae_params(sae_id, layer, pairs, scale)}"


def profile_value(
    wire_name: str,
    source: str,
    lam: float,
    pairs: dict[int, float] = STORED,
    sae_id: str = SAE_ID,
    layer: int = LAYER,
) -> str:
    head = f'profile;name="{wire_name}";source={source};intensity="{lam!r}"'
    return f"{head};{sae_params(sae_id, layer, pairs, lam)}"
