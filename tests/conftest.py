"""Shared fixtures: settings with a temporary data dir, apps with and without the real model."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from miserver.app import Server
from miserver.engines.base import LoadOptions
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.models.registry import embedded_default
from miserver.settings import Settings
from miserver.steering.sae import SAE, load_sae
from tests.postgres import PostgresServer
from tools import probe_train, sae_train

MODEL_ID = "SmolLM2-135M-Instruct"
GGUF_ID = f"{MODEL_ID}:Q4_1"  # the embedded default model: its GGUF, served by llama.cpp
JSON = {"Content-Type": "application/json"}  # every POST, PUT and DELETE sends it (LOC-GEN-19)
LOCAL_URL = "http://127.0.0.1"  # a loopback server answers only loopback Host names (LOC-SEC-17)


LOCAL_PEER = ("127.0.0.1", 50000)

# Every engine the suite loads runs its forward passes on one thread, in process and in the
# `miserver serve` processes it starts (tests/e2e/conftest.py): on two cores shared with the
# test process and its other servers, two OpenMP teams of two threads stall each other at
# every barrier (BENCHMARKS.md measured decoding 5x slower). Tests of the `threads` setting
# itself set it.
ENGINE_THREADS = 1
ONE_THREAD = LoadOptions(threads=ENGINE_THREADS)


class LocalClient(TestClient):
    """A TestClient that reaches the server as a local client does: Host 127.0.0.1, from a
    loopback peer.

    A server bound to loopback refuses any other Host (LOC-SEC-17), TestClient's
    default `testserver` included; a peer that is not loopback is confined to the
    model folders (LOC-SEC-58).
    """

    def __init__(self, app: ASGIApp, **options: Any) -> None:
        options.setdefault("client", LOCAL_PEER)
        super().__init__(app, base_url=LOCAL_URL, **options)


def cache_dir() -> Path:
    """Converted models are derived data: shared by every test run on this machine."""
    return Path(os.environ.get("MISERVER_CACHE_DIR") or platformdirs.user_cache_dir("miserver"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), model=MODEL_ID)


@pytest.fixture
def bare_client(settings: Settings) -> Iterator[TestClient]:
    """A server whose launch model is known but never loaded (for refusals before any load)."""
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    data = tmp_path_factory.mktemp("data")
    return Server(
        Settings(
            data_dir=data,
            cache_dir=cache_dir(),
            queue_heartbeat=0.2,
            model=MODEL_ID,
            threads=ENGINE_THREADS,
        )
    )


@pytest.fixture(scope="session")
def client(model_server: Server) -> Iterator[TestClient]:
    """The real SmolLM2 served in process (loaded once per session)."""
    with LocalClient(model_server, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the tests' own, started once per worker when a test asks."""
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_at(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a store's database is, once each way (store/database.py): a SQLite file, and
    a fresh PostgreSQL database's DSN."""
    if request.param == "sqlite":
        return tmp_path / "data" / "miserver.sqlite3"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.fresh()


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return embedded_default()


@pytest.fixture(scope="session")
def trained_sae() -> SAE:
    """The default-config SAE, trained once into `<cache>/saes/<name>` and reused after."""
    config = sae_train.TrainConfig()
    folder = sae_train.cache_dir() / "saes" / config.name()
    trained_once(folder, "sae_weights.safetensors", lambda out: sae_train.build(out, config))
    return load_sae(folder)


def trained_once(folder: Path, marker: str, build: Callable[[Path], object]) -> None:
    """`build` a fixture into `folder` unless it holds `marker` already: into a staging
    folder renamed when whole, so a session that stops halfway leaves nothing half-made."""
    if (folder / marker).is_file():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".training-", dir=folder.parent))
    try:
        build(staging)
        staging.chmod(0o755)
        staging.rename(folder)
    except OSError:
        if not folder.is_dir():  # not another session's finished copy: a real failure
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@pytest.fixture(scope="session")
def trained_probe() -> Path:
    """The French-vs-English linear probe's sidecar (tools/probe_train.py), trained once
    into `<cache>/probes/<name>` and reused after."""
    config = probe_train.TrainConfig()
    folder = sae_train.cache_dir() / "probes" / config.name()
    trained_once(folder, "metrics.json", lambda out: probe_train.build(out, config))
    return folder / f"{probe_train.NAME}.json"


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> Iterator[TransformersEngine]:
    """SmolLM2 on transformers loaded apart from any server: direct forwards for references."""
    loaded = load_transformers_engine(
        gguf_path, model_id="ref", cache_dir=cache_dir(), options=ONE_THREAD
    )
    yield loaded
    loaded.close()


SAE_ID = "smollm2-l12"
OTHER_SAE_ID = "smollm2-l12-copy"


@pytest.fixture(scope="session")
def saes_dir(trained_sae: SAE, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saes directory holding the trained SAE twice, as SAE_ID and OTHER_SAE_ID."""
    folder = tmp_path_factory.mktemp("saes")
    source = sae_train.cache_dir() / "saes" / sae_train.TrainConfig().name()
    for name in (SAE_ID, OTHER_SAE_ID):
        (folder / name).symlink_to(source, target_is_directory=True)
    return folder


@pytest.fixture
def steer_settings(tmp_path: Path, saes_dir: Path) -> Settings:
    """Settings of a steering server: the transformers SmolLM2, the trained SAEs, fresh data."""
    return steering_settings(tmp_path / "data", saes_dir)


def steering_settings(data_dir: Path, saes_dir: Path) -> Settings:
    """A steering server's settings: the transformers SmolLM2, the SAEs in `saes_dir`."""
    return Settings(
        data_dir=data_dir,
        cache_dir=cache_dir(),
        saes_dir=saes_dir,
        model=MODEL_ID,
        queue_heartbeat=0.2,
        threads=ENGINE_THREADS,
    )


BF16_MODEL_ID = "SmolLM2-135M-Instruct-bf16"


@pytest.fixture(scope="session")
def bf16_models_dir(gguf_path: Path) -> Path:
    """A models dir holding SmolLM2 saved in bfloat16 (built once into the cache, atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from miserver.engines.transformers.conversion import cached_hf_folder

    models = cache_dir() / "test-models-bf16"
    folder = models / BF16_MODEL_ID
    if not (folder / "config.json").is_file():
        source = cached_hf_folder(gguf_path, cache_dir(), lambda _: None)
        models.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".bf16-", dir=models))
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
            model.save_pretrained(staging)
            AutoTokenizer.from_pretrained(source).save_pretrained(staging)
            staging.chmod(0o755)
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return models


TIMING = "timing"
"""The xdist group of the modules whose tests bound a time or a rate: one worker runs them
all, one after another, so no two of them ever measure at once."""
LONG = (
    "tests/integration/test_device_check.py",
    "tests/e2e/test_cluster.py",
    "tests/e2e/test_coding_agent.py",
    "tests/conformance/test_kit_against_our_server.py",
    "tests/integration/test_sae_training.py",
    "tests/e2e/test_batched_steering.py",
)
"""Groups of few tests that each take half a minute or more: handed out first. xdist hands
out the others by their number of tests, most first, which would leave these to the end,
where one worker runs one of them alone while the other has nothing left."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's `--dist loadgroup` (tools/check.py), a module's tests run on one
    worker, in file order, so its module-scoped servers and models start once; a module
    marked with a group of its own (TIMING) runs with that group.

    Every test needs an id of its own: xdist hands tests to workers by id and runs one of
    a set that share it, so a collection with a shared id fails (pytest 9.2 gives all of a
    Schemathesis function's operations one id; pyproject.toml keeps pytest below it)."""
    twins = [nodeid for nodeid, count in Counter(i.nodeid for i in items).items() if count > 1]
    if twins:
        raise pytest.UsageError(f"tests that share an id (xdist would run one): {twins[:5]}")
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order the controller hands groups out in
        items[:] = handed_out(items)


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None
    return str(marker.kwargs.get("name", marker.args[0] if marker.args else ""))


def handed_out(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with each group's tests together (in their order), the LONG groups first,
    then the rest by their number of tests, most first (tools/check.py runs xdist with
    `--no-loadscope-reorder`, so this order is the one it hands out)."""
    sizes = Counter(_group(item) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int, str]:
        group = _group(item)
        first = LONG.index(group) if group in LONG else len(LONG)
        return first, -sizes[group], group

    return sorted(items, key=rank)
