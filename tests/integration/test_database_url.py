"""`--database-url` that cannot be used refuses the start, naming the flag and never the
password (issue 49: the state in PostgreSQL when a DSN is given; LOC-SEC-02's exit 2)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from miserver import cli
from miserver.store.database import Database, DatabaseUnavailable
from tests.e2e.conftest import free_port
from tests.postgres import PostgresServer

SECRET = "s3cret-pw"


def _closed_dsn() -> str:
    """A DSN of a port nothing listens on, with a password to keep out of every log."""
    return f"postgresql://miserver:{SECRET}@127.0.0.1:{free_port()}/state"


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    return int(exited.value.code or 0)


def test_serve_refuses_an_unreachable_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[Any] = []
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: runs.append(k))
    argv = ["serve", "--data-dir", str(tmp_path), "--database-url", _closed_dsn()]
    with caplog.at_level(logging.ERROR, "miserver"):
        assert _exit_code(argv) == 2
    assert runs == []  # nothing listens
    assert "refusing to start" in caplog.text and "--database-url" in caplog.text
    assert "127.0.0.1" in caplog.text and SECRET not in caplog.text


def test_cluster_refuses_it_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[Any] = []
    monkeypatch.setattr("miserver.cluster.local.run", lambda *a: started.append(a) or 0)
    argv = ["cluster", "--data-dir", str(tmp_path), "--database-url", _closed_dsn()]
    with caplog.at_level(logging.ERROR, "miserver"):
        assert _exit_code(argv) == 2
    assert started == []
    assert "--database-url" in caplog.text and SECRET not in caplog.text


def test_cluster_migrates_a_usable_database_once_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: PostgresServer
) -> None:
    """A usable DSN passes the check (its schema made there, once) and Ray starts."""
    started: list[Any] = []
    monkeypatch.setattr("miserver.cluster.local.run", lambda *a: started.append(a) or 0)
    dsn = postgres.fresh()
    assert _exit_code(["cluster", "--data-dir", str(tmp_path), "--database-url", dsn]) == 0
    assert len(started) == 1
    with psycopg.connect(dsn) as db:
        versions = db.execute("SELECT COUNT(*) FROM schema_version").fetchone()
    assert versions is not None and versions[0] > 0


def test_without_psycopg_the_refusal_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(DatabaseUnavailable, match=r"miserver\[postgres\]"):
        Database(_closed_dsn())
