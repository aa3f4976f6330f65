"""The OpenAPI documents, read and validated once per process.

Connexion's `add_api` with a document's path renders it with Jinja, parses its
YAML in pure Python and validates it against the OpenAPI schema, every time:
about 1.4 s for our two documents, on every app built. A process builds one
app per `Server` (the test suite builds hundreds), so `document` keeps each
document's Connexion `Specification` by the digest of its file and every app
gets its own copy of it (a few milliseconds); `add_document` registers that
copy as Connexion's own `add_api` does once it has loaded a document.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from pathlib import Path
from typing import Any

from connexion import AsyncApp
from connexion.middleware.main import API
from connexion.spec import Specification


def document(path: Path) -> Specification:
    """`path`'s document, parsed and validated at most once per content."""
    return copy.deepcopy(_loaded(path, hashlib.sha256(path.read_bytes()).hexdigest()))


@functools.cache
def _loaded(path: Path, digest: str) -> Specification:
    del digest  # the cache's key: a changed file is loaded again
    return Specification.load(path)


def add_document(app: AsyncApp, specification: Specification, **options: Any) -> None:
    """Register `specification` on `app` with `options` (add_api's keyword arguments)."""
    middleware = app.middleware
    given = middleware.options.replace(**options)
    middleware.apis.append(API(specification, base_path=None, name=None, **given.__dict__))
