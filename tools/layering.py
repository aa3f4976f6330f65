"""The layering, written down and checked (STYLE.md habit 2).

generated/    imports nothing of ours
impl/engines  imports neither connexion nor starlette (nor our HTTP layer)
conformance/  speaks only HTTP: imports nothing of ours but itself (miserver.conformance)

python -m tools.layering   # exit 1 and name every violation
"""

from __future__ import annotations

import ast
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder, banned module prefixes, why, and the prefixes allowed despite a ban (its own package)
RULES: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    ("generated", ("miserver",), "generated/ imports nothing of ours", ()),
    (
        "impl/engines",
        (
            "connexion",
            "starlette",
            "miserver.http",
            "miserver.handlers",
            "miserver.serving",
            "miserver.app",
        ),
        "engines never import the HTTP layer",
        (),
    ),
    (
        "conformance",
        ("miserver", "impl"),
        "conformance/ speaks only HTTP",
        ("miserver.conformance",),
    ),
]

log = logging.getLogger("layering")


def imports(path: Path, package: str) -> Iterator[str]:
    """Absolute module names a file imports; `package` is the module's own dotted name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module or ""
            else:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level])
                yield f"{base}.{node.module}" if node.module else base


def _module(path: Path) -> str:
    """`impl/engines/base.py` -> `miserver.engines.base` (`__init__` is a module too)."""
    top, *rest = path.relative_to(ROOT).with_suffix("").parts
    root = {
        "impl": "miserver",
        "generated": "miserver.generated",
        "conformance": "miserver.conformance",
    }[top]
    return ".".join([root, *rest])


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations() -> Iterator[str]:
    for folder, banned, why, allowed in RULES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in imports(path, _module(path)):
                if _within(name, banned) and not _within(name, allowed):
                    yield f"{path.relative_to(ROOT)} imports {name}: {why}"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    found = list(violations())
    for line in found:
        log.error(line)
    log.info("layering: %s", "ok" if not found else f"{len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
