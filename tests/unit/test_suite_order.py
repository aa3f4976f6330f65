"""The order xdist hands the suite's groups out in (tests/conftest.py, tools/check.py)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONG

ROOT = Path(__file__).resolve().parents[2]


def test_every_long_group_is_a_module_of_the_suite() -> None:
    """A LONG name that no longer names a module would leave that module to the end again."""
    assert [name for name in LONG if not (ROOT / name).is_file()] == []
