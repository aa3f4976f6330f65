"""What a server reports as it works, read as a client reads it.

- `data_of(lines)`: the `data:` payloads of a response's SSE lines, parsed (`[DONE]` kept).
- `Events(url)`: GET /api/events read in a thread, for the servers of this process
  (tests/servers.py); `wait_for(ready)` polls what it has seen. `ClosingEvents` also closes
  its connection when the block ends, so a server's shutdown does not wait for a ping.
- `Listener(api)`: the same stream for a `miserver serve` process (tests/e2e), keeping its
  comments and headers too; `wait_for(condition)` fails the test when the time is up.
- `RowWatch(server)`: GET /api/health/inference polled in a thread: the most slots in use
  and the longest queue it saw.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import pytest

WAIT_S = 120.0  # an `Events` stream's read timeout, and how long `wait_for` waits
CLOSING_TIMEOUT_S = 60.0  # a `ClosingEvents` client's timeout


class Served(Protocol):
    """A running server (tests/e2e/conftest.py's `LiveServer`): its `.../v1` base URL."""

    @property
    def base_url(self) -> str: ...


def data_of(lines: list[str]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


class Events:
    """GET /api/events read in a thread: every (event, data) pair seen so far."""

    def __init__(self, url: str) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> Events:
        self._thread.start()
        self.wait_for(lambda seen: any(name == "state" for name, _ in seen))
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _read(self) -> None:
        name = ""
        with httpx.stream("GET", f"{self._url}/api/events", timeout=WAIT_S) as response:
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    self.seen.append((name, json.loads(line.removeprefix("data: "))))

    def wait_for(self, ready: Callable[[list[tuple[str, dict[str, Any]]]], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ready(list(self.seen)):
            assert time.monotonic() < deadline, self.seen[-5:]
            time.sleep(0.05)


class ClosingEvents(Events):
    """GET /api/events read in a thread, its connection closed when the block ends (so the
    server's shutdown does not wait for the next ping)."""

    def __exit__(self, *_: object) -> None:
        super().__exit__()
        client = self._client
        if client is not None:
            client.close()

    def _read(self) -> None:
        name = ""
        self._client = httpx.Client(timeout=CLOSING_TIMEOUT_S)
        try:
            with self._client.stream("GET", f"{self._url}/api/events") as response:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        self.seen.append((name, json.loads(line.removeprefix("data: "))))
        except (httpx.HTTPError, RuntimeError, AttributeError):
            return  # closed by __exit__


class Listener:
    """GET /api/events read in a thread: every (event, data) pair it has seen."""

    def __init__(self, api: str) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.comments: list[str] = []
        self._api = api
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self.content_type = ""
        self.headers: dict[str, str] = {}

    def __enter__(self) -> Listener:
        self._thread.start()
        self.wait_for(lambda: any(name == "state" for name, _ in self.seen))
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()

    def _read(self) -> None:
        name = ""
        with httpx.stream("GET", f"{self._api}/events", timeout=60.0) as response:
            self.content_type = response.headers["content-type"]
            self.headers = dict(response.headers)
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    self.seen.append((name, json.loads(line[6:])))
                elif line.startswith(":"):
                    self.comments.append(line)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [data for event, data in list(self.seen) if event == name]

    def wait_for(self, condition: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out; events so far: {[n for n, _ in self.seen]}")
            time.sleep(0.05)


class RowWatch:
    """GET /api/health/inference polled in a thread: the most slots in use, and the longest
    queue, it saw."""

    def __init__(self, server: Served) -> None:
        self._url = server.base_url.removesuffix("/v1") + "/api/health/inference"
        self.most = 0
        self.queued = 0
        self.backend = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.is_set():
                health = client.get(self._url).json()
                self.most = max(self.most, health["slots_in_use"])
                self.queued = max(self.queued, health["queue_length"])
                self.backend = health["backend"]
                time.sleep(0.01)

    def __enter__(self) -> RowWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
