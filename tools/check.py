"""Everything CI runs, behind one command: `python -m tools.check`.

ruff format --check, ruff check, mypy (strict on impl/), the layering
check, the codegen and published-schema checks, Debian's chromium installed when
missing (tools/browser.py), then pytest (warnings are errors). Stops at the
first failing step and exits with its status.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STEPS: list[tuple[str, list[str]]] = [
    ("format", [PY, "-m", "ruff", "format", "--check", "impl", "tools", "tests", "conformance"]),
    ("lint", [PY, "-m", "ruff", "check", "impl", "tools", "tests", "conformance"]),
    ("types", [PY, "-m", "tools.typecheck"]),
    ("layering", [PY, "-m", "tools.layering"]),
    ("codegen", [PY, "-m", "tools.codegen", "--check"]),
    ("schemas", [PY, "-m", "tools.schemas", "--check"]),
    ("browser", [PY, "-m", "tools.browser"]),  # Debian's chromium for the UI tests
    ("tests", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]),
]

log = logging.getLogger("check")


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="== %(message)s")
    only = set(argv)
    for name, cmd in STEPS:
        if only and name not in only:
            continue
        log.info("%s: %s", name, " ".join(cmd[1:]))
        code = subprocess.run(cmd, cwd=ROOT).returncode
        if code != 0:
            log.error("%s failed (exit %d)", name, code)
            return code
    log.info("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
