"""The download job's rules that need no network (REQ-003 DL-10/11, SEC-47)."""

from __future__ import annotations

from pathlib import Path

import pytest

from miserver.models.catalog import Catalog, CatalogError, CatalogFile, entries
from miserver.models.downloads import ATTEMPTS, Downloads, retry_waits
from miserver.settings import Settings


def test_retry_waits_start_at_two_seconds_and_double_to_sixty() -> None:
    """LOC-DL-10, LOC-DL-11: six attempts, so five waits; 2 s doubling, never above 60 s; the
    settings' defaults are those."""
    defaults = Settings()
    assert ATTEMPTS == 6
    assert (defaults.download_retry_wait_s, defaults.download_retry_wait_max_s) == (2.0, 60.0)
    assert retry_waits(2.0, 60.0) == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert retry_waits(10.0, 60.0) == [10.0, 20.0, 40.0, 60.0, 60.0]


def _document(name: str) -> dict[str, object]:
    return {
        "schema": "mi.catalog/v1",
        "models": [
            {
                "id": "x",
                "title": "X",
                "quant": "Q4_0",
                "repo": "org/x-GGUF",
                "revision": "main",
                "files": [{"name": name, "bytes": 1}],
            }
        ],
    }


@pytest.mark.parametrize(
    "name", ["../x.gguf", "a/x.gguf", "/etc/x.gguf", "..", ".", "x.gguf/..", "a\\x.gguf"]
)
def test_an_entry_file_that_is_not_a_plain_name_never_becomes_an_entry(name: str) -> None:
    """LOC-SEC-47: a catalog (shipped, `--catalog`, or added-models.json) whose file name has a
    path separator, `.`/`..` or is absolute is refused when read, so no entry can name a
    file outside the models directory."""
    assert entries(_document("x-Q4_0.gguf"))[0].files[0].name == "x-Q4_0.gguf"
    with pytest.raises(CatalogError, match="files"):
        entries(_document(name))


def test_partial_paths_stay_in_the_models_directory(tmp_path: Path) -> None:
    """LOC-SEC-45..47: the path of an entry's `.part` is its plain name in the models directory;
    a name that is not plain is refused even if a caller built the entry by hand."""
    jobs = Downloads(Catalog([]), tmp_path, "http://127.0.0.1:9", lambda *_: None)
    assert jobs._path(CatalogFile("m.gguf", 1), ".part") == tmp_path / "m.gguf.part"
    for bad in ("../m.gguf", "a/m.gguf", "/m.gguf", "..", ".", "", "a\\m.gguf"):
        with pytest.raises(ValueError, match="not a plain file name"):
            jobs._path(CatalogFile(bad, 1), ".part")


def test_curl_dies_with_the_server_by_setpriv_or_prctl(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOC-DL-06 (a `.part` no orphan writes on after a `kill -9`; tests/e2e/
    test_downloads_live.py kills a server): on Linux curl starts under `setpriv --pdeathsig
    KILL` where util-linux has it (no fork of the whole server), else with a `prctl` in the
    child before exec."""
    from miserver.models import downloads

    downloads._tied_to_server.cache_clear()
    try:
        monkeypatch.setattr(downloads.shutil, "which", lambda name: f"/usr/bin/{name}")
        assert downloads._tied_to_server() == (
            ("/usr/bin/setpriv", "--pdeathsig", "KILL", "--"),
            None,
        )
        downloads._tied_to_server.cache_clear()
        monkeypatch.setattr(downloads.shutil, "which", lambda _: None)
        assert downloads._tied_to_server() == ((), downloads._die_with_parent)
    finally:
        downloads._tied_to_server.cache_clear()
