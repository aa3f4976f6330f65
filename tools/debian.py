"""Debian's packages the tests drive, installed when missing.

    python -m tools.debian   # exit 0 once every program below is there

- chromium, for the browser tests (issue 22): Playwright's own browser download
  cannot run on the CI machines, so the tests drive the distribution's chromium
  through `executable_path`.
- PostgreSQL, for the store's tests on a DSN (tests/postgres.py starts a server
  of its own in a temporary folder; issue 49).

As root (CI), a missing package is installed with apt-get; otherwise with
`sudo -n` when that needs no password. Exit 1, saying which, when one stays
missing.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

log = logging.getLogger("debian")


def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def postgres_bin() -> str | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), newest version first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version, reverse=True)
    return os.path.dirname(found[0]) if found else None


def _version(path: str) -> int:
    part = path.split("/")[4]
    return int(part) if part.isdigit() else 0


# package: how to find what it installs
PACKAGES: dict[str, Callable[[], str | None]] = {
    "chromium": _chromium,
    "postgresql": postgres_bin,
}


def install(packages: list[str]) -> None:
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        done = subprocess.run([*prefix, *step], env=env, capture_output=True, check=False)
        if done.returncode != 0 and step[1] == "install":
            log.error("%s", done.stderr.decode("utf-8", "replace").strip()[-2000:])


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="== debian: %(message)s")
    missing = [name for name, find in PACKAGES.items() if find() is None]
    if missing:
        log.info("missing: %s: installing Debian's packages", ", ".join(missing))
        install(missing)
    for name, find in PACKAGES.items():
        log.info("%s: %s", name, find() or "MISSING")
    left = [name for name, find in PACKAGES.items() if find() is None]
    if left:
        log.error("could not install %s; the tests need them", ", ".join(left))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
