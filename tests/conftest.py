"""Shared fixtures: settings with a temporary data dir, apps with and without the real model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.models.registry import embedded_default
from miserver.settings import Settings

MODEL_ID = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Converted models are derived data: shared by every test run on this machine."""
    return Path(os.environ.get("MISERVER_CACHE_DIR") or platformdirs.user_cache_dir("miserver"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)


@pytest.fixture
def bare_client(settings: Settings) -> Iterator[TestClient]:
    """A server whose launch model is known but never loaded (for refusals before any load)."""
    with TestClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    data = tmp_path_factory.mktemp("data")
    return Server(
        Settings(data_dir=data, cache_dir=cache_dir(), queue_heartbeat=0.2, model=MODEL_ID)
    )


@pytest.fixture(scope="session")
def client(model_server: Server) -> Iterator[TestClient]:
    """The real SmolLM2 served in process (loaded once per session)."""
    with TestClient(model_server, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return embedded_default()
