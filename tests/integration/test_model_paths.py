"""Model paths and where a client may open them from, over real HTTP (LOC-SEC-56..66).

A "network" server is bound to this machine's own non-loopback address and
reached through it, so the TCP peer is really not loopback; a machine with no
such address skips those tests (the rules themselves are also unit tests,
tests/unit/test_model_locator.py). The "local" servers are on 127.0.0.1.
The model is the embedded SmolLM2 GGUF, copied (or hard-linked) where a test
needs it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from miserver.models.registry import embedded_default
from miserver.settings import Settings
from tests.conftest import JSON, cache_dir
from tests.servers import Running, serving

LAUNCH_ID = "SmolLM2-135M-Instruct:Q4_1"  # the embedded GGUF, served by llama.cpp
LOAD_TIMEOUT_S = 60.0


def network_address() -> str | None:
    """This machine's address on its default route, if it has one that is not loopback."""
    for target in ("192.0.2.1", "10.255.255.255", "198.51.100.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((target, 9))  # UDP: picks a route, sends nothing
            except OSError:
                continue
            address = str(probe.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return None


def place(source: Path, target: Path) -> Path:
    """`source` at `target` as a real file (a hard link where the filesystem allows)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return target


@dataclass(frozen=True, slots=True)
class Layout:
    models: Path  # the models directory, holding inside.Q4_1.gguf and a link out
    scan: Path  # a scan directory, holding scanned.Q4_1.gguf
    outside: Path  # Elsewhere.Q4_1.gguf, in no model folder
    settings: Settings


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    gguf = embedded_default()
    models, scan = tmp_path / "models", tmp_path / "scan"
    place(gguf, models / "inside.Q4_1.gguf")
    place(gguf, scan / "scanned.Q4_1.gguf")
    outside = place(gguf, tmp_path / "elsewhere" / "Elsewhere.Q4_1.gguf")
    os.symlink(outside, models / "link.Q4_1.gguf")  # inside by name, outside once resolved
    settings = Settings(
        data_dir=tmp_path / "data", cache_dir=cache_dir(), models_dir=models, scan_dirs=(scan,)
    )
    return Layout(models, scan, outside, settings)


@contextlib.contextmanager
def network_server(settings: Settings) -> Iterator[Running]:
    address = network_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to be a network peer from")
    opened = Settings(**{**_fields(settings), "host": "0.0.0.0", "no_api_key": True})
    with serving(opened, address) as running:
        yield running


def _fields(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in settings.__dataclass_fields__}


def load(client: httpx.Client, model: str | None = None, **headers: str) -> httpx.Response:
    body = {} if model is None else {"model": model}
    return client.post("/api/session/load", json=body, headers={**JSON, **headers})


def ready(client: httpx.Client) -> dict[str, Any]:
    """/api/info once the load settled (ready or error)."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        info: dict[str, Any] = client.get("/api/info").json()
        if info["state"] in ("ready", "error") or time.monotonic() > deadline:
            return info
        time.sleep(0.1)


def refused_outside(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "outside_models_dir",
        "model",
        "permission_error",
    )


# -- a network peer is confined to the model folders ---------------------------------


def test_a_network_peer_cannot_open_a_path_outside(layout: Layout) -> None:
    """LOC-SEC-58, -59, -60, -61, -65: absolute, `..` and symbolic-link paths that resolve
    outside the model folders are 403 outside_models_dir, whatever forwarding headers say,
    and nothing is loaded or unloaded."""
    with network_server(layout.settings) as server, server.client() as client:
        for model in (
            str(layout.outside),
            "../elsewhere/Elsewhere.Q4_1.gguf",
            str(layout.models / ".." / "elsewhere" / "Elsewhere.Q4_1.gguf"),
            "link.Q4_1.gguf",
            "/etc/passwd",
            "/no/such/file.gguf",
        ):
            refused_outside(load(client, model))
        forwarded = {"X-Forwarded-For": "127.0.0.1", "Forwarded": "for=127.0.0.1"}
        refused_outside(load(client, str(layout.outside), **forwarded))
        assert client.get("/api/info").json()["state"] == "empty"


def test_a_network_peer_opens_models_inside_the_folders(layout: Layout) -> None:
    """LOC-SEC-56, -58, -60: a relative path is taken in the models directory, an absolute
    one in a scan directory passes, and the model loads; a missing one inside is a 404."""
    with network_server(layout.settings) as server, server.client() as client:
        missing = load(client, "not-here.gguf")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert load(client, "inside.Q4_1.gguf").status_code == 202
        info = ready(client)
        assert info["state"] == "ready" and info["model"]["id"] == "inside:Q4_1"
        assert info["model"]["path"] == str(layout.models / "inside.Q4_1.gguf")
        assert load(client, str(layout.scan / "scanned.Q4_1.gguf")).status_code == 202
        assert ready(client)["model"]["id"] == "scanned:Q4_1"


def test_the_launch_model_is_not_confined(layout: Layout) -> None:
    """LOC-SEC-66: the operator's launch model opens for a network peer, by path and by id."""
    with network_server(layout.settings) as server, server.client() as client:
        assert load(client, str(embedded_default())).status_code == 202
        assert ready(client)["model"]["id"] == LAUNCH_ID
        assert load(client).status_code == 202  # the configured model: the launch id


def test_a_network_peer_cannot_configure_a_path_outside(layout: Layout) -> None:
    """LOC-SEC-62: `PUT /api/config` lists an outside `model` in `rejected` and does not
    store it; a path inside is stored. A body-less load of an outside path a loopback
    client configured is refused for the network peer (LOC-SEC-61)."""
    with network_server(layout.settings) as server, server.client() as client:
        before = client.get("/api/config").json()["values"]["model"]
        response = client.put("/api/config", json={"values": {"model": str(layout.outside)}})
        changed = response.json()
        assert "outside_models_dir" in changed["rejected"]["model"]
        assert changed["values"]["model"] == before and "model" not in changed["user_keys"]
        inside = client.put("/api/config", json={"values": {"model": "inside.Q4_1.gguf"}})
        assert inside.json()["values"]["model"] == "inside.Q4_1.gguf"
        server.app.state.config.update(values={"model": str(layout.outside)}, peer_local=True)
        refused_outside(load(client))
        assert client.get("/api/info").json()["state"] == "empty"


# -- a loopback peer may open any file, unless --models-only ----------------------------


def test_a_loopback_peer_opens_a_model_anywhere(layout: Layout) -> None:
    """LOC-SEC-63, -56: from loopback any model file opens; it is then served on /v1 by
    its id, and `PUT /api/config` stores the path."""
    with serving(layout.settings) as server, server.client() as client:
        assert load(client, str(layout.outside)).status_code == 202
        info = ready(client)
        assert info["state"] == "ready" and info["model"]["id"] == "Elsewhere:Q4_1"
        assert client.get("/api/config").json()["values"]["model"] == str(layout.outside)
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert "Elsewhere:Q4_1" in ids
        body = {"model": "Elsewhere:Q4_1", "messages": [{"role": "user", "content": "Hi"}]}
        chat = client.post("/v1/chat/completions", json={**body, "max_tokens": 3}, headers=JSON)
        assert chat.status_code == 200, chat.text


def test_models_only_confines_loopback_too(layout: Layout) -> None:
    """LOC-SEC-64, -61, -62: with --models-only a loopback client is confined as a network
    one is: 403 on load, `rejected` on config; inside still opens."""
    settings = Settings(**{**_fields(layout.settings), "models_only": True})
    with serving(settings) as server, server.client() as client:
        refused_outside(load(client, str(layout.outside)))
        refused_outside(load(client, "link.Q4_1.gguf"))
        rejected = client.put("/api/config", json={"values": {"model": str(layout.outside)}})
        assert "model" in rejected.json()["rejected"]
        assert load(client, "inside.Q4_1.gguf").status_code == 202
        assert ready(client)["model"]["id"] == "inside:Q4_1"
