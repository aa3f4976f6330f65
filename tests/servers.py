"""`miserver`'s app under uvicorn in a thread of this process, on a socket it binds.

`serving(settings)` runs `Server(settings, preload=False)` until the block ends
and yields a `Running` (its URL, port and app, and `client()` for requests);
`settings_in(folder)` gives settings with their data in `folder` and the shared
model cache; `KEY` is the API key the keyed servers are given. A start takes a
fraction of a second, so a test module can start the servers it needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import cache_dir
from tools.uvicorn_thread import uvicorn_serving

KEY = "s3cret-key_0123"
START_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class Running:
    """A server answering on `url` (http://ADDRESS:PORT), and its app."""

    url: str
    port: int
    app: Server

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)


@contextlib.contextmanager
def serving(settings: Settings, address: str = "127.0.0.1") -> Iterator[Running]:
    """`Server(settings, preload=False)` under uvicorn on a socket bound to `address`
    (loopback by default), until the block ends.

    The socket is bound here, so `settings.host` may say what the security
    model should assume (a network bind) while the test stays on loopback.
    """
    app = Server(settings, preload=False)
    with uvicorn_serving(app, address, START_TIMEOUT_S) as port:
        yield Running(f"http://{address}:{port}", port, app)


def settings_in(folder: Path, **changes: Any) -> Settings:
    return Settings(data_dir=folder / "data", cache_dir=cache_dir(), **changes)
