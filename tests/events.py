"""What a server reports as it works, read as a client reads it.

- `data_of(lines)`: the `data:` payloads of a response's SSE lines, parsed (`[DONE]` kept).
- `Events(origin)`: GET /api/events read in a thread, its comments and headers kept, its
  connection closed when the block ends; `wait_for(ready)` polls what it has seen.
- `DONE_KEYS`: the keys of a `done` event (and of a reply's `millm_summary`).
- `RowWatch(server)`: GET /api/health/inference polled in a thread: the most slots in use
  and the longest queue it saw.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import pytest

DONE_KEYS = frozenset(  # a `done` event's (LOC-EVENTS-13), and a reply's `millm_summary`
    {
        "cancelled",
        "tokens",
        "tok_s",
        "load_s",
        "prefill_s",
        "prefill_tps",
        "n_prompt",
        "n_past",
        "compute_s_tok",
        "cpu_s_tok",
        "majflt_tok",
        "loop_overhead_s_tok",
        "ttft_s",
    }
)
WAIT_S = 120.0  # an `Events` stream's read timeout, and how long `wait_for` waits
STOP_S = 5.0  # how long the block's end waits for the reader to see it hung up


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
    """GET /api/events of the server at `origin` read in a thread: every (event, data) pair
    seen so far, its comments, and the response's headers. The block's end hangs up at once
    (a server shutting down waits for its open streams, and the reader would see a stop only
    at its next event, a heartbeat's seconds away)."""

    def __init__(self, origin: str) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.comments: list[str] = []
        self.content_type = ""
        self.headers: dict[str, str] = {}
        self._url = f"{origin}/api/events"
        self._client = httpx.Client(timeout=WAIT_S)
        self._socket: socket.socket | None = None
        self._hang_up = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> Events:
        self._thread.start()
        self.wait_for(lambda seen: any(name == "state" for name, _ in seen))
        return self

    def __exit__(self, *_: object) -> None:
        self._hang_up.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):  # wakes the reader's blocked read; close would not
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=STOP_S)
        self._client.close()

    def _read(self) -> None:
        name = ""
        with (
            contextlib.suppress(httpx.HTTPError, RuntimeError, OSError),  # hung up by __exit__
            self._client.stream("GET", self._url) as response,
        ):
            self._socket = response.extensions["network_stream"].get_extra_info("socket")
            if self._hang_up.is_set():
                return
            self.content_type = response.headers["content-type"]
            self.headers = dict(response.headers)
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    self.seen.append((name, json.loads(line.removeprefix("data: "))))
                elif line.startswith(":"):
                    self.comments.append(line)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [data for event, data in list(self.seen) if event == name]

    def wait_for(
        self, ready: Callable[[list[tuple[str, dict[str, Any]]]], Any], timeout: float = WAIT_S
    ) -> None:
        """Until `ready(seen)` holds; the test fails when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not ready(list(self.seen)):
            if time.monotonic() > deadline:
                pytest.fail(f"timed out; events so far: {[n for n, _ in self.seen][-20:]}")
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
