"""mypy over the `miserver` namespace as it is installed (impl/ -> miserver, ...).

mypy cannot follow setuptools' editable import hook, so this builds a tree of
symlinks in `.typecheck/` with the installed layout and checks that:
`python -m tools.typecheck` (strict, per pyproject.toml's [tool.mypy]).
mypy's cache lives in `build/mypy/` (or `$MYPY_CACHE_DIR`), outside the tree that
is rebuilt, so a second run checks only what changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".typecheck"
CACHE = Path(os.environ.get("MYPY_CACHE_DIR") or ROOT / "build" / "mypy")
MOUNTS = {"generated": "generated", "conformance": "conformance", "spec": "spec"}


def build() -> Path:
    """`.typecheck/miserver/`: impl/'s entries plus the mapped top-level folders, as links."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "miserver"
    package.mkdir(parents=True)
    for child in (ROOT / "impl").iterdir():
        if child.name != "__pycache__":
            (package / child.name).symlink_to(child)
    for name, folder in MOUNTS.items():
        (package / name).symlink_to(ROOT / folder)
    return package


def main() -> int:
    build()
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(CACHE),
        "-p",
        "miserver",
    ]
    return subprocess.run(cmd, cwd=TREE).returncode


if __name__ == "__main__":
    sys.exit(main())
