"""Root paths for /v1 operations, as vLLM serves them: `/tokenize` is `/v1/tokenize`.

An operation of spec/openapi/v1.yaml marked `x-served-at-root: true` answers
at its path without the `/v1` prefix too. The alias is rewritten to the /v1
path before anything else reads the request, so it passes the same security
checks (Host, Origin, key, body: http/security.py), the same routing and
validation, and answers the same errors as the /v1 path it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX = "/v1"
MARK = "x-served-at-root"


def root_paths(document: Mapping[str, Any]) -> frozenset[str]:
    """The paths of `document` (v1.yaml) that some operation marks as served at the root."""
    return frozenset(
        path
        for path, item in document["paths"].items()
        if any(isinstance(op, dict) and op.get(MARK) for op in item.values())
    )


class RootAliases:
    """Rewrites a root alias (`/tokenize`) to the /v1 path it stands for."""

    def __init__(self, app: ASGIApp, paths: Iterable[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            path = PREFIX + scope["path"]
            scope = {**scope, "path": path, "raw_path": path.encode("ascii")}
        await self.app(scope, receive, send)
