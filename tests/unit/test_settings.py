"""Settings: defaults, environment, flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from miserver.settings import Settings, add_flags, from_args, from_env


def test_defaults_are_documented_values() -> None:
    """DECISIONS: loopback bind on 8000 by default; QUEUE_MAX_WAITING 16."""
    settings = Settings()
    assert (settings.host, settings.port, settings.queue_max_waiting) == ("127.0.0.1", 8000, 16)
    assert settings.ignored_fields_header_max_bytes == 1024


def test_environment_then_flags() -> None:
    """A flag wins over the environment, which wins over the default."""
    env = {
        "MISERVER_PORT": "9001",
        "QUEUE_MAX_WAITING": "3",
        "MISERVER_DATA_DIR": "/tmp/d",
        "QUEUE_HEARTBEAT_SECONDS": "0.5",
    }
    base = from_env(env)
    assert (base.port, base.queue_max_waiting, base.data_dir) == (9001, 3, Path("/tmp/d"))
    assert base.queue_heartbeat == 0.5
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--port", "9002", "--models-dir", "/tmp/m"])
    merged = from_args(args, base)
    assert (merged.port, merged.queue_max_waiting) == (9002, 3)
    assert merged.resolved_models_dir == Path("/tmp/m")
    assert from_env({"MISERVER_DATA_DIR": "/x"}).resolved_models_dir == Path("/x/models")
