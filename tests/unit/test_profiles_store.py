"""Steering profiles in SQLite: CRUD, the active profile, a restart keeps both."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from miserver.store.database import Database
from miserver.store.profiles import ProfileError, ProfileNotFound, ProfileStore

FEATURES = [{"index": 7, "strength": 2.5}, {"index": 3, "strength": -1.0}]


@pytest.fixture
def path(database_at: Path | str) -> Path | str:
    """A SQLite file, then a PostgreSQL database (store/database.py)."""
    return database_at


def test_profiles_and_the_active_one_survive_a_restart(path: Path | str) -> None:
    """Issue #4 acceptance: profiles survive a server restart (DECISIONS: SQLite, WAL)."""
    db = Database(path)
    store = ProfileStore(db)
    saved = store.save('humör "q" 100%', "smol-sae", 12, FEATURES, description="unicode name")
    store.save("plain", "smol-sae", 12, [(1, 0.5)])
    store.activate("plain")
    db.close()
    again = ProfileStore(Database(path))
    assert [p.name for p in again.list()] == ['humör "q" 100%', "plain"]
    reloaded = again.get('humör "q" 100%')
    assert reloaded == saved
    assert reloaded.features == ((3, -1.0), (7, 2.5))
    active = again.active()
    assert active is not None and active.name == "plain"


def test_replace_keeps_created_and_delete_clears_active(path: Path | str) -> None:
    """A saved name is replaced (created kept); deleting the active profile clears it."""
    store = ProfileStore(Database(path))
    first = store.save("p", "s", 1, [(1, 1.0)])
    second = store.save("p", "s", 2, [(2, 2.0)])
    assert second.created == first.created and second.layer == 2
    store.activate("p")
    store.delete("p")
    assert store.active() is None and store.list() == []
    with pytest.raises(ProfileNotFound):
        store.get("p")
    with pytest.raises(ProfileNotFound):
        store.activate("p")
    with pytest.raises(ProfileNotFound):
        store.delete("p")


@pytest.mark.parametrize(
    "features",
    [
        [(1, 1.0), (1, 2.0)],
        [(-1, 1.0)],
        [(1, float("nan"))],
        [(1, float("inf"))],
        [(1, True)],
        [(True, 1.0)],
        [{"index": "1", "strength": 1.0}],
    ],
    ids=[
        "OAI-INL-09-duplicate",
        "negative-index",
        "OAI-INL-10-nan",
        "OAI-INL-10-inf",
        "OAI-INL-11-bool",
        "bool-index",
        "string-index",
    ],
)
def test_bad_feature_sets_are_refused_and_change_nothing(path: Path | str, features: list) -> None:  # type: ignore[type-arg]
    """A refused save leaves the store as it was."""
    store = ProfileStore(Database(path))
    with pytest.raises(ProfileError):
        store.save("bad", "s", 1, features)
    assert store.list() == []


def test_threads_share_the_store(path: Path | str) -> None:
    """The server touches the store from several threads."""
    store = ProfileStore(Database(path))

    def work(i: int) -> None:
        store.save(f"p{i}", "s", i, [(i, float(i) + 0.5)])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.layer for p in store.list()) == list(range(8))
