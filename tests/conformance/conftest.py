"""Serving any ASGI app over real HTTP for the kit: uvicorn in a thread on a loopback socket."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from starlette.types import ASGIApp

from tools.uvicorn_thread import uvicorn_serving


@contextlib.contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 until the block ends; yields its origin (`http://127.0.0.1:PORT`).

    Our real server loads the model during start-up, so it may take a while to answer."""
    with uvicorn_serving(app) as port:
        yield f"http://127.0.0.1:{port}"
