"""The checks, one module per area of the contract; importing this package registers them.

The order here is the order they run and are reported in.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..registry import REGISTRY, Check
from . import (
    activations,
    circuits,
    errors,
    models,
    probes,
    replies,
    responses_api,
    schema,
    scoring,
    steering,
    streaming,
    validation,
)

__all__ = [
    "activations",
    "all_checks",
    "circuits",
    "errors",
    "models",
    "probes",
    "replies",
    "responses_api",
    "schema",
    "scoring",
    "select",
    "steering",
    "streaming",
    "validation",
]


def all_checks() -> list[Check]:
    """Every check the kit has (importing this package registered them)."""
    return list(REGISTRY)


def select(names: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """The checks named in `names` (all when empty) less those in `skip`, in registry order."""
    wanted, unwanted = set(names), set(skip)
    every = all_checks()
    unknown = (wanted | unwanted) - {c.name for c in every}
    if unknown:
        raise KeyError(f"no such check: {', '.join(sorted(unknown))}")
    return [c for c in every if (not wanted or c.name in wanted) and c.name not in unwanted]
