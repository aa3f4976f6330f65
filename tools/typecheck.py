"""mypy over the `miserver` namespace as it is installed (impl/ -> miserver, ...).

mypy cannot follow setuptools' editable import hook, so this builds a tree of
symlinks in `.typecheck/` with the installed layout and checks that:
`python -m tools.typecheck` (strict, per pyproject.toml's [tool.mypy]).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".typecheck"
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
        "-p",
        "miserver",
    ]
    return subprocess.run(cmd, cwd=TREE).returncode


if __name__ == "__main__":
    sys.exit(main())
