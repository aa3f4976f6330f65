"""Writes the corpus, tests/data/hostile/: routes.json and one JSON Lines file per family.

    python -m tools.hostile           # (re)write the files
    python -m tools.hostile --check   # exit 1 if the files differ from what it would write

The families come from the targets' base bodies (targets.py) and, for the
wrong-type cases, from spec/openapi's request-body schemas; the random bytes
from a fixed seed. The output is checked in; the tests read only it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import corpus, fields, paths, reader, targets, wire

log = logging.getLogger("hostile")

FAMILIES: dict[str, Callable[[], Iterator[dict[str, Any]]]] = {
    **wire.FAMILIES,
    **paths.FAMILIES,
    **reader.FAMILIES,
    **fields.FAMILIES,
}


def files() -> dict[str, str]:
    """File name -> text, for every file of the corpus."""
    missing = targets.uncovered()
    if missing:
        raise ValueError(f"no target reaches {missing}: add one to tools/hostile/targets.py")
    out = {corpus.ROUTES: json.dumps(targets.routes_file(), indent=1, ensure_ascii=False) + "\n"}
    seen: set[str] = set()
    for family, make in FAMILIES.items():
        lines = []
        for case in make():
            if case["id"] in seen:
                raise ValueError(f"case id {case['id']} is used twice")
            seen.add(case["id"])
            lines.append(json.dumps(case, ensure_ascii=False))
        out[f"{family}.jsonl"] = "\n".join(lines) + "\n"
    return out


def write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (folder / name).write_text(text, encoding="utf-8")
        log.info("%s: %d lines", name, text.count("\n"))


def differences(folder: Path) -> list[str]:
    """The corpus files that are missing or differ from what `write` would write."""
    expected = files()
    found = []
    for name, text in expected.items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            found.append(name)
    found += [p.name for p in folder.glob("*.jsonl") if p.name not in expected]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.check:
        stale = differences(corpus.DATA)
        for name in stale:
            log.error("%s is stale: run python -m tools.hostile", name)
        return 1 if stale else 0
    write(corpus.DATA)
    return 0
