"""The real server as a subprocess: `miserver serve` under uvicorn on a free loopback port.

`live_server` starts one with `--data-dir` in a temporary folder, waits until
`GET /v1/models` answers, hands out its base URL (`http://127.0.0.1:PORT/v1`)
and always terminates it. The converted-model cache is shared with the rest
of the suite (`tests.conftest.cache_dir`), so a start takes seconds.

The server's engine runs its forward passes on one thread
(`MISERVER_THREADS=1`, tests.conftest.ENGINE_THREADS) unless the test's own
environment says otherwise: on a 2-core machine shared with the test process
(and its other servers), two OpenMP threads contending for the cores made
decoding about 8x slower than one thread here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from tests import openai_reference
from tests.conftest import ENGINE_THREADS, MODEL_ID, cache_dir
from tests.openai_reference import Check

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class LiveServer:
    """A running `miserver serve` process and where it answers."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command() -> list[str]:
    """`miserver` from this interpreter's environment (cli.py has no `__main__` hook)."""
    script = shutil.which("miserver", path=str(Path(sys.executable).parent))
    if script is not None:
        return [script]
    return [sys.executable, "-c", "from miserver.cli import main; main()"]


def _wait_until_up(server: LiveServer, key: str | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"miserver exited with {server.process.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(httpx.TransportError):
            response = httpx.get(f"{server.base_url}/models", headers=headers, timeout=2.0)
            if response.status_code == 200:
                return
        time.sleep(0.25)
    pytest.fail(f"miserver did not answer within {START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT (uvicorn's graceful shutdown), then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to a cluster's whole process group: its Ray head and workers, which its
    process started (a test's cluster keeps nothing a drain would save: Serve's graceful
    stop took 8 s of every run)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def live_server(
    workdir: Path,
    env: Mapping[str, str] | None = None,
    model: str | None = MODEL_ID,
    args: Sequence[str] = (),
    key: str | None = None,
    command: str = "serve",
) -> Iterator[LiveServer]:
    """Run `miserver serve` until the block ends; its output goes to `workdir/server.log`.

    `model` None starts it as a user would, with no `--model`: the embedded GGUF.
    `args` are more `serve` flags; `key` an API key it is started with (a key file).
    `command` "cluster" starts `miserver cluster` (its own flags go in `args`) in a
    process group of its own, so that its Ray processes end with it.
    """
    port = free_port()
    log_path = workdir / "server.log"
    if key is not None:
        (workdir / "api-key").write_text(key)
        args = [*args, "--api-key-file", str(workdir / "api-key")]
    argv = [
        *serve_command(),
        command,
        *(["--model", model] if model else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(workdir / "data"),
        "--cache-dir",
        str(cache_dir()),
        "--log-level",
        "info",
        *args,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                "OMP_NUM_THREADS": "1",
                "MISERVER_THREADS": str(ENGINE_THREADS),
                **os.environ,
                **(env or {}),
            },
            start_new_session=command == "cluster",
        )
        try:
            server = LiveServer(f"http://127.0.0.1:{port}/v1", process, log_path)
            _wait_until_up(server, key)
            yield server
        finally:
            if command == "cluster":
                _kill_group(process)
            else:
                _stop(process)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The default server: the real SmolLM2, default queue settings."""
    with live_server(tmp_path_factory.mktemp("e2e-server")) as running:
        yield running


@pytest.fixture(scope="session")
def base_url(server: LiveServer) -> str:
    return server.base_url


@pytest.fixture(scope="session")
def queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A second server whose queue holds one waiter and whose heartbeat is 0.5 s; serial
    (`--parallel 1`), so one request holds the slot as the queue's tests need."""
    env = {"QUEUE_MAX_WAITING": "1", "QUEUE_HEARTBEAT_SECONDS": "0.5"}
    workdir = tmp_path_factory.mktemp("e2e-queue-server")
    with live_server(workdir, env, args=["--parallel", "1"]) as running:
        yield running


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`miserver serve` with no model argument: SmolLM2's GGUF on llama.cpp."""
    with live_server(tmp_path_factory.mktemp("e2e-default"), model=None) as running:
        yield running


@pytest.fixture(scope="session")
def openai_check() -> Check:
    """Checks every body a client on `openai_reference.client(openai_check)` receives
    against OpenAI's own published schemas (tests/openai_reference.py)."""
    return Check()


CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Note whether a test's call failed, for `_bodies_are_openais`."""
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def _bodies_are_openais(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses `openai_check` fails on any body that broke OpenAI's schema, even
    one that a client library caught and wrapped (a test that failed already only gets
    the problems as a report section)."""
    if "openai_check" not in request.fixturenames:
        yield
        return
    check: Check = request.getfixturevalue("openai_check")
    check.problems.clear()
    check.received.clear()
    yield
    if request.node.stash.get(CALL_FAILED, False):
        if check.problems:
            request.node.add_report_section("teardown", "openai schema", "\n".join(check.problems))
        return
    assert not check.problems, "\n".join(check.problems)


def checked_sdk(base_url: str, check: Check, timeout: float = 60.0) -> OpenAI:
    """The official SDK as a user points it at miserver (no retries: every status is seen),
    every body it receives checked against OpenAI's schemas by `check`."""
    return OpenAI(
        base_url=base_url,
        api_key="not-needed",
        max_retries=0,
        timeout=timeout,
        http_client=openai_reference.client(check),
    )


@pytest.fixture(scope="session")
def sdk(base_url: str, openai_check: Check) -> Iterator[OpenAI]:
    """`checked_sdk` on the in-process-built default server."""
    with checked_sdk(base_url, openai_check) as client:
        yield client


def async_sdk(base_url: str, check: Check) -> AsyncOpenAI:
    """The official async client on `base_url`, every body checked against OpenAI's schemas."""
    return AsyncOpenAI(
        base_url=base_url,
        api_key="not-needed",
        max_retries=0,
        http_client=openai_reference.async_client(check),
    )
