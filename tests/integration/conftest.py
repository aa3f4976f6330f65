"""Fixtures the integration tests share: the default GGUF server beside the session's
transformers one, a parameter over both, and the two engines driven directly (issue 46's
cross-engine tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.llamacpp import LlamaCppEngine
from miserver.engines.transformers import TransformersEngine
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, MODEL_ID, LocalClient, cache_dir
from tests.engines import both_engines


@pytest.fixture(scope="module")
def gguf_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The default server: SmolLM2's GGUF on llama.cpp, loaded at start (one per module)."""
    data = tmp_path_factory.mktemp("gguf-server")
    settings = Settings(data_dir=data, cache_dir=cache_dir(), threads=ENGINE_THREADS)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(params=["transformers", "gguf"])
def served(request: pytest.FixtureRequest) -> tuple[TestClient, str]:
    """(a client, the model to name): the transformers SmolLM2, or its GGUF on llama.cpp."""
    if request.param == "transformers":
        return request.getfixturevalue("client"), MODEL_ID
    return request.getfixturevalue("gguf_client"), GGUF_ID


@pytest.fixture(scope="module")
def engine_pair() -> Iterator[tuple[LlamaCppEngine, TransformersEngine]]:
    """SmolLM2 on each engine, driven directly (`tests.engines.both_engines`, 3 rows on
    llama.cpp), one pair per module."""
    loaded = both_engines("pair", rows=3)
    yield loaded
    for engine in loaded:
        engine.close()
