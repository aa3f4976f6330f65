"""Everything CI runs, behind one command: `python -m tools.check`.

ruff format --check, ruff check, the layering check, the codegen and
published-schema checks, Debian's chromium and PostgreSQL installed when missing
(tools/debian.py), then pytest (warnings are errors) with its slowest tests
listed, and mypy (strict on impl/) beside it at the lowest priority: mypy is one
thread for about a minute, and the tests leave a core idle about a fifth of their
time (servers starting, streams paced), so running it alongside saves most of
that minute without taking a core from a test.
Stops at the first failing step and exits with its status (mypy's, if the tests
passed and it failed); every step's wall time is printed as it ends and again,
as a table, at the end.

Every step may write bytecode, whatever PYTHONDONTWRITEBYTECODE says: with it set
(as on the CI machines), each of the suite's few hundred Python processes (the
workers, every `miserver serve` a test starts) compiled the project's modules
from source again, and each worker rewrote every test module's assertions again.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SLOWEST = 40  # pytest's --durations: the slowest tests every CI log lists
# pytest-xdist: two workers (two cores; every engine in the suite runs one thread, so two
# workers never run two OpenMP teams on a core), a module's tests on one worker
# (tests/conftest.py groups them; the TIMING group runs together), the groups handed out in
# the order tests/conftest.py collects them (its LONG ones first)
WORKERS = ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"]
STEPS: list[tuple[str, list[str]]] = [
    ("format", [PY, "-m", "ruff", "format", "--check", "impl", "tools", "tests", "conformance"]),
    ("lint", [PY, "-m", "ruff", "check", "impl", "tools", "tests", "conformance"]),
    ("layering", [PY, "-m", "tools.layering"]),
    ("codegen", [PY, "-m", "tools.codegen", "--check"]),
    ("schemas", [PY, "-m", "tools.schemas", "--check"]),
    ("debian", [PY, "-m", "tools.debian"]),  # chromium (UI tests), PostgreSQL (store tests)
    ("types", [PY, "-m", "tools.typecheck"]),  # started, then run beside the tests (BESIDE)
    (
        "tests",
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *WORKERS, f"--durations={SLOWEST}"],
    ),
]

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # see above
BESIDE = frozenset({"types"})  # started without waiting: the next step runs alongside

log = logging.getLogger("check")


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="== %(message)s")
    only = set(argv)
    took: list[tuple[str, float]] = []
    code = 0
    began = time.monotonic()
    beside: list[tuple[str, Beside]] = []
    for name, cmd in STEPS:
        if only and name not in only:
            continue
        log.info("%s: %s", name, " ".join(cmd[1:]))
        start = time.monotonic()
        if name in BESIDE and not (only and only <= BESIDE):
            beside.append((name, Beside(cmd)))
            continue
        code = subprocess.run(cmd, cwd=ROOT, env=ENV).returncode
        took.append((name, time.monotonic() - start))
        log.info("%s took %.1f s", name, took[-1][1])
        if code != 0:
            log.error("%s failed (exit %d)", name, code)
            break
    for name, running in beside:
        ended, seconds = running.result()
        took.append((name, seconds))
        log.info("%s took %.1f s (beside the steps after it)", name, seconds)
        if ended != 0:
            log.error("%s failed (exit %d)", name, ended)
            code = code or ended
    _report(took, time.monotonic() - began)
    if code == 0:
        log.info("all checks passed")
    return code


class Beside:
    """A step run in the background; its exit status and wall time once it ends."""

    def __init__(self, cmd: list[str]) -> None:
        self._start = time.monotonic()
        # at the lowest priority: it takes the cores' idle time, never the tests' own
        self._process = subprocess.Popen(cmd, cwd=ROOT, env=ENV, preexec_fn=_lowest)
        self._seconds = 0.0
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self._process.wait()
        self._seconds = time.monotonic() - self._start

    def result(self) -> tuple[int, float]:
        self._waiter.join()
        return self._process.returncode, self._seconds


def _lowest() -> None:
    os.nice(19)


def _report(took: list[tuple[str, float]], wall: float) -> None:
    """Each step's wall time, and the whole run's (steps beside others overlap them)."""
    for name, seconds in took:
        log.info("%-9s %8.1f s", name, seconds)
    log.info("%-9s %8.1f s", "total", wall)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
