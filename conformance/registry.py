"""Every check, registered by `@check(*requirement_ids)` in the order the modules define them.

A check is a function `def name(ctx: Context) -> None`, named after the property
it checks. It passes by returning, fails by raising a `Failure`, and raises
`NotOffered` when the server does not offer the extension it checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .context import Context

CheckFunction = Callable[[Context], None]
REQUIREMENT_ID = re.compile(r"^(OAI|MIS)-[A-Z0-9]+-\d{2}$")


@dataclass(frozen=True, slots=True)
class Check:
    """One registered check: its name, the requirement IDs it covers (REQ-000's `OAI-`, or
    the contract's own `MIS-` for what goes past it: docs/CONFORMANCE.md), its function and
    summary."""

    name: str
    requirements: tuple[str, ...]
    function: CheckFunction
    summary: str


REGISTRY: list[Check] = []


def check(*requirements: str) -> Callable[[CheckFunction], CheckFunction]:
    """Register the decorated function as a check covering `requirements` (`OAI-` or `MIS-`)."""
    bad = [rid for rid in requirements if not REQUIREMENT_ID.match(rid)]
    if not requirements or bad:
        raise ValueError(f"a check needs REQ-000 requirement IDs, got {requirements!r}")

    def register(function: CheckFunction) -> CheckFunction:
        paragraph = (function.__doc__ or "").strip().split("\n\n")[0]
        summary = " ".join(line.strip() for line in paragraph.splitlines())
        REGISTRY.append(Check(function.__name__, tuple(requirements), function, summary))
        return function

    return register
