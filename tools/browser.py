"""Debian's chromium for the browser tests (issue 22), installed when missing.

    python -m tools.browser   # exit 0 once `chromium` is on PATH

Playwright's own browser download cannot run on the CI machines, so the
tests drive the distribution's chromium through `executable_path`. As root
(CI), a missing one is installed with apt-get; otherwise with `sudo -n`
when that needs no password. Exit 1, saying why, when it stays missing.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

log = logging.getLogger("browser")
NAMES = ("chromium", "chromium-browser")


def found() -> str | None:
    return next(filter(None, (shutil.which(name) for name in NAMES)), None)


def install() -> None:
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run([*prefix, *step], env=env, capture_output=True, check=False)
        if done.returncode != 0 and step[1] == "install":
            log.error("%s", done.stderr.decode("utf-8", "replace").strip()[-2000:])


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="== browser: %(message)s")
    if (path := found()) is None:
        log.info("chromium is missing: installing Debian's package")
        install()
        path = found()
    if path is None:
        log.error("chromium could not be installed; the browser tests need it")
        return 1
    log.info("%s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
