"""A cluster deployment's settings (cluster/options.py): an engine replica's threads."""

from __future__ import annotations

from miserver.cluster import options


def test_an_engine_replica_runs_as_many_threads_as_ray_reserved_cpus() -> None:
    """`--engine-cpus 1` (the default) on a machine Ray fills with replicas: each runs one
    thread, not every core (two replicas of two threads each on two cores gave a third of
    one server's tokens/s under eight clients)."""
    settings, _ = options.parsed([], facing=False)
    assert settings.threads == 0  # the server's default: every usable core
    assert options.engine_threads(settings, 1.0).threads == 1
    assert options.engine_threads(settings, 4.0).threads == 4
    assert options.engine_threads(settings, 2.5).threads == 2


def test_threads_given_or_no_cpus_reserved_keep_the_settings() -> None:
    given, _ = options.parsed(["--threads", "3"], facing=False)
    assert options.engine_threads(given, 1.0).threads == 3
    shared, _ = options.parsed([], facing=False)
    assert options.engine_threads(shared, 0.0).threads == 0  # --engine-cpus 0: the cores shared
    assert options.engine_threads(shared, 0.5).threads == 0
