"""An ASGI app served with uvicorn in a thread of this process, for as long as a block runs.

The tests serve `miserver`'s app this way (a start takes a fraction of a second), and both
the tests and the benchmarks serve the fake Hugging Face site of tools/fakehub.py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp


@contextlib.contextmanager
def uvicorn_serving(
    app: ASGIApp,
    address: str = "127.0.0.1",
    start_timeout: float = 120.0,
    graceful_s: float | None = None,
) -> Iterator[int]:
    """Serve `app` with uvicorn in a thread on a socket bound to `address` until the block
    ends; yields the port. Forwarding headers are not read, as in `miserver serve`.
    `graceful_s` bounds how long the end waits for open connections (an event stream)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        proxy_headers=False,
        timeout_graceful_shutdown=graceful_s,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout)
        sock.close()
