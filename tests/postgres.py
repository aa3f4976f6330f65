"""A PostgreSQL server of the tests' own (issue 49: the state in PostgreSQL when a DSN is
given): Debian's server programs (tools/debian.py installs them) running a new cluster in
a temporary folder, on loopback, with trust authentication and no fsync.

PostgreSQL refuses to run as root: as root (CI), its programs run as the `postgres` user
and the folder is theirs. Each test asks for a database of its own (`fresh`).
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tools.bench.common import free_port
from tools.debian import postgres_bin

USER = "postgres"  # the superuser initdb makes, and the system user that runs it as root


class PostgresServer:
    def __init__(self) -> None:
        found = postgres_bin()
        if found is None:
            raise RuntimeError("PostgreSQL's programs are missing: run python -m tools.debian")
        self._bin = Path(found)
        self._as = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
        self.folder = Path(tempfile.mkdtemp(prefix="miserver-postgres-"))
        if self._as:
            account = pwd.getpwnam(USER)
            os.chown(self.folder, account.pw_uid, account.pw_gid)
        self.port = free_port()
        self._names = itertools.count(1)
        data = self.folder / "data"
        self._run("initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "start", "-w", "-D", str(data), "-l", log, "-o", options)
        self._data = data

    def _run(self, program: str, *args: str) -> None:
        command = [*self._as, str(self._bin / program), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stdout}{done.stderr}")

    def dsn(self, database: str = USER) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def fresh(self) -> str:
        """A new empty database's DSN."""
        import psycopg

        name = f"test_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-D", str(self._data), "-m", "immediate")
        shutil.rmtree(self.folder, ignore_errors=True)
