"""The Hugging Face routes against a fake site on loopback (REQ-003 HFS, HFM, HFA, HFE,
SEC-48..55; issue 20 item 3). The fake answers as the site does; the first test checks it
with `huggingface_hub`'s own client, so the shapes are the site's and not our guess."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import gguf
import httpx
import numpy as np
import pytest
from huggingface_hub import HfApi

from miserver.app import Server
from miserver.models.hub import EXPAND
from miserver.settings import Settings
from tests.conftest import JSON, cache_dir
from tests.events import Events
from tools.fakehub import Fault, Hub, serve_hub
from tools.uvicorn_thread import uvicorn_serving

REPO = "fake-org/tiny-GGUF"
GATED = "fake-org/gated-GGUF"
TOKEN = "hf_secret_token_123"
SPLIT = [f"big/tiny-split-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
WAIT_S = 60.0


def projector_gguf() -> bytes:
    """A small real GGUF file whose header says it is a projector (clip, mmproj)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mmproj.gguf"
        writer = gguf.GGUFWriter(str(path), arch="clip")
        writer.add_type("mmproj")
        writer.add_tensor("v.blk.0.attn_q.weight", np.zeros((4, 4), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


@pytest.fixture
def hub(gguf_path: Path) -> Iterator[tuple[Hub, str]]:
    hub = Hub()
    data = gguf_path.read_bytes()
    hub.add(REPO, "tiny-Q4_1.gguf", data)
    hub.add(REPO, "mmproj-tiny-f16.gguf", projector_gguf())
    hub.add(REPO, "draft-tiny-Q8_0.gguf", b"d" * 2000)
    hub.add(REPO, "README.md", b"# tiny")
    for name, size in zip(SPLIT, (3000, 2000, 1000), strict=True):
        hub.add(REPO, name, os.urandom(size))
    hub.add("fake-org/broken-GGUF", "half-00001-of-00002.gguf", b"h" * 100)
    hub.add(GATED, "gated-Q4_K_M.gguf", b"g" * 500)
    hub.gated[GATED] = TOKEN
    hub.meta = {
        REPO: {"downloads": 500, "likes": 7, "lastModified": "2024-10-01T12:00:00.000Z"},
        "fake-org/broken-GGUF": {"downloads": 900, "likes": 1},
        GATED: {"downloads": 100, "likes": 2, "gated": "manual"},
    }
    for i in range(25):  # more matches than a search answers
        hub.add(f"many/tiny-{i:02d}-GGUF", "m.gguf", b"m")
    with serve_hub(hub) as base:
        yield hub, base


@pytest.fixture
def api(tmp_path: Path, hub: tuple[Hub, str]) -> Iterator[httpx.Client]:
    _, base = hub
    catalog = {
        "schema": "mi.catalog/v1",
        "models": [
            {
                "id": f"hf:{REPO}/tiny-Q4_1.gguf",
                "title": "shipped",
                "quant": "Q4_1",
                "repo": REPO,
                "revision": "main",
                "files": [{"name": "tiny-Q4_1.gguf", "bytes": 1}],
            }
        ],
    }
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=tmp_path / "models",
        hf_endpoint=base,
        catalog_file=tmp_path / "catalog.json",
        download_retry_wait_s=0.05,
    )
    with (
        uvicorn_serving(Server(settings, preload=False), graceful_s=1.0) as port,
        httpx.Client(base_url=f"http://127.0.0.1:{port}/api", timeout=WAIT_S) as client,
    ):
        yield client


def test_the_fake_site_answers_as_huggingface_hub_reads_it(hub: tuple[Hub, str]) -> None:
    """Issue 20 (the fake hub is shaped like the real API): huggingface_hub's list_models and
    list_repo_tree parse the fake's answers, and the search our server sends asks for the
    same fields the client does."""
    fake, base = hub
    client = HfApi(endpoint=base)
    found = list(
        client.list_models(
            search="tiny",
            filter="gguf",
            sort="downloads",
            limit=3,
            expand=["downloads", "likes", "lastModified", "gated"],
        )
    )
    assert [m.id for m in found][:1] == [REPO]
    assert (found[0].downloads, found[0].likes, found[0].gated) == (500, 7, False)
    assert found[0].last_modified is not None
    files = {f.path: f for f in client.list_repo_tree(REPO, recursive=True) if hasattr(f, "size")}
    assert files[SPLIT[0]].size == 3000 and files[SPLIT[0]].lfs is not None
    assert len(files[SPLIT[0]].lfs.sha256) == 64
    [sent] = [r["query"] for r in fake.requests if r["path"] == "/api/models"]
    asked = parse_qs(str(sent))
    assert set(asked["expand"]) == set(EXPAND)  # our search asks for the client's names
    assert (asked["search"], asked["filter"], asked["sort"]) == (["tiny"], ["gguf"], ["downloads"])


def test_search_most_downloaded_first_at_most_twenty(api: httpx.Client) -> None:
    """LOC-HFS-01, LOC-HFS-02, LOC-HFS-03, LOC-HFS-04, LOC-HFS-05, LOC-HFS-06, LOC-HFS-07,
    LOC-HFS-08: repositories with gguf files matching the query, most downloaded first, at most
    twenty, each {id, downloads, likes, modified, gated} (gated a bool)."""
    found = api.post("/hf/search", json={"query": "GGUF"}).json()
    assert found["query"] == "GGUF" and len(found["repos"]) == 20
    downloads = [r["downloads"] for r in found["repos"]]
    assert downloads == sorted(downloads, reverse=True)
    first = {r["id"]: r for r in found["repos"]}
    assert first[REPO] == {
        "id": REPO,
        "downloads": 500,
        "likes": 7,
        "modified": "2024-10-01T12:00:00.000Z",
        "gated": False,
    }
    assert first[GATED]["gated"] is True


def test_a_repository_lists_its_gguf_files_as_models(api: httpx.Client) -> None:
    """LOC-HFM-01, LOC-HFM-02, LOC-HFM-03, LOC-HFM-04, LOC-HFM-05, LOC-HFM-06, LOC-HFM-07,
    LOC-HFM-08, LOC-HFM-09, LOC-HFM-10, LOC-HFM-11, LOC-HFM-12: one model per file, a split set
    once by its first shard (`count`, `complete`, every shard in `files`), roles from the names
    (mmproj: projector, draft-: draft), models first; a tree, blob or resolve URL gives its
    revision and file."""
    listing = api.post("/hf/models", json={"repo": REPO}).json()
    assert (listing["repo"], listing["revision"], listing["file"]) == (REPO, "main", "")
    models = {m["name"]: m for m in listing["models"]}
    assert [m["role"] for m in listing["models"]] == ["model", "model", "draft", "projector"]
    split = models[SPLIT[0]]
    assert (split["count"], split["complete"], split["bytes"], split["quant"]) == (
        3,
        True,
        6000,
        "Q8_0",
    )
    assert [f["path"] for f in split["files"]] == SPLIT
    assert models["tiny-Q4_1.gguf"]["quant"] == "Q4_1"
    url = f"https://huggingface.co/{REPO}/blob/v1.0/tiny-Q4_1.gguf"
    named = api.post("/hf/models", json={"repo": url}).json()
    assert (named["revision"], named["file"]) == ("v1.0", "tiny-Q4_1.gguf")
    tree = api.post("/hf/models", json={"repo": f"https://huggingface.co/{REPO}/tree/dev"}).json()
    assert (tree["revision"], tree["file"]) == ("dev", "")
    broken = api.post("/hf/models", json={"repo": "fake-org/broken-GGUF"}).json()
    assert broken["models"][0]["complete"] is False


def test_refusals_of_the_listing(api: httpx.Client, hub: tuple[Hub, str]) -> None:
    """LOC-HFM-13, LOC-HFM-14, LOC-HFM-16, LOC-HFM-17, LOC-SEC-49, LOC-SEC-51: text that is
    no repository id nor a URL on the site is 400 not_a_repo and nothing is fetched (a URL
    on another host too); a repository the site answers 401 for (unknown, or gated without
    the token) is 404 saying so, never an empty listing; the gated one lists with its
    token."""
    fake, _ = hub
    for text in ("just words", "a/b/c", "../etc/passwd", "https://evil.example/org/repo", "o/.."):
        refused = api.post("/hf/models", json={"repo": text})
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "not_a_repo"), text
    assert fake.requests == []
    for repo in ("fake-org/nothing-here", GATED):
        missing = api.post("/hf/models", json={"repo": repo})
        assert missing.status_code == 404 and "401" in missing.json()["error"]["message"]
    opened = api.post("/hf/models", json={"repo": GATED, "token": TOKEN})
    assert opened.status_code == 200 and opened.json()["models"][0]["name"] == "gated-Q4_K_M.gguf"


def test_an_unreachable_site_is_502(tmp_path: Path) -> None:
    """LOC-HFM-14: a listing that could not be fetched at all is 502 upstream_error."""
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=tmp_path / "models",
        hf_endpoint="http://127.0.0.1:9",
    )
    with uvicorn_serving(Server(settings, preload=False)) as port:
        failed = httpx.post(f"http://127.0.0.1:{port}/api/hf/models", json={"repo": REPO})
    assert (failed.status_code, failed.json()["error"]["code"]) == (502, "upstream_error")


def test_add_download_and_forget(api: httpx.Client, hub: tuple[Hub, str], tmp_path: Path) -> None:
    """LOC-HFA-01, LOC-HFA-02, LOC-HFA-03, LOC-HFA-04, LOC-HFA-05, LOC-HFA-06, LOC-HFA-07,
    LOC-HFA-08, LOC-HFA-09, LOC-HFA-10, LOC-HFA-11, LOC-HFE-01, LOC-HFE-02, LOC-HFE-03,
    LOC-MODELS-37, LOC-SEC-48: an added split set becomes `hf:<repo>/<name>` with one file per
    shard (URLs on the endpoint, the site's SHA-256), listed `added`, kept in added-models.json;
    added again, 201 and replaced; it downloads by its id into the models directory (folders
    dropped); forgetting it leaves its files; a split set with shards missing is 409, a shipped id
    409, an unknown or shipped id on forget 404, a name with `..` 400 with nothing fetched."""
    fake, base = hub
    added = api.post("/hf/add", json={"repo": REPO, "name": SPLIT[0]})
    assert added.status_code == 201, added.text
    entry_id = f"hf:{REPO}/{SPLIT[0]}"
    assert added.json() == {
        "id": entry_id,
        "title": "tiny-split-Q8_0-00001-of-00003",
        "quant": "Q8_0",
        "bytes": 6000,
    }
    assert api.post("/hf/add", json={"repo": REPO, "name": SPLIT[0]}).status_code == 201
    listed = [e for e in api.get("/models").json()["catalog"] if e["id"] == entry_id]
    assert len(listed) == 1 and listed[0]["added"] is True
    files = listed[0]["files"]
    assert [f["url"] for f in files] == [f"{base}/{REPO}/resolve/main/{p}" for p in SPLIT]
    kept = json.loads((tmp_path / "data" / "added-models.json").read_text())
    assert [m["id"] for m in kept["models"]] == [entry_id]
    with Events(str(api.base_url).rstrip("/").removesuffix("/api")) as events:
        assert api.post("/models/download", json={"id": entry_id}).status_code == 202
        events.wait_for(
            lambda seen: any(n == "download" and d["state"] in ("done", "error") for n, d in seen)
        )
    assert [d["state"] for n, d in events.seen if n == "download"][-1] == "done"
    for path in SPLIT:
        assert (tmp_path / "models" / Path(path).name).read_bytes() == fake.repos[REPO][path]
    assert api.delete(f"/hf/entry/{entry_id}", headers=JSON).json() == {"ok": True}
    assert all(e["id"] != entry_id for e in api.get("/models").json()["catalog"])
    assert json.loads((tmp_path / "data" / "added-models.json").read_text())["models"] == []
    assert (tmp_path / "models" / Path(SPLIT[0]).name).is_file()
    incomplete = api.post(
        "/hf/add", json={"repo": "fake-org/broken-GGUF", "name": "half-00001-of-00002.gguf"}
    )
    assert (incomplete.status_code, incomplete.json()["error"]["code"]) == (409, "incomplete_set")
    shipped = api.post("/hf/add", json={"repo": REPO, "name": "tiny-Q4_1.gguf"})
    assert (shipped.status_code, shipped.json()["error"]["code"]) == (409, "conflict")
    for entry in (entry_id, f"hf:{REPO}/tiny-Q4_1.gguf", "nope"):
        assert api.delete(f"/hf/entry/{entry}", headers=JSON).status_code == 404
    before = len(fake.requests)
    bad = api.post("/hf/add", json={"repo": REPO, "name": "../x.gguf"})
    assert bad.status_code == 400 and len(fake.requests) == before


def test_the_token_goes_to_the_endpoint_only_and_is_kept_nowhere(
    api: httpx.Client,
    hub: tuple[Hub, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """LOC-SEC-50, LOC-SEC-52, LOC-SEC-53, LOC-SEC-54, LOC-SEC-55, LOC-HFM-15: the token
    reaches the configured site as a bearer token on the listing and the search, both
    fetched with the system curl; curl never sees the token on its command line (a wrapper
    records every argv); no log line, settings.json or added-models.json holds it."""
    fake, _ = hub
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    argv_log = tmp_path / "argv.log"
    (wrapper / "curl").write_text(f'#!/bin/sh\necho "$@" >> {argv_log}\nexec /usr/bin/curl "$@"\n')
    (wrapper / "curl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper}:{os.environ['PATH']}")
    # this test's own temporary files: another worker's request may hold a header in /tmp
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    caplog.set_level(logging.DEBUG)
    assert (
        api.post(
            "/hf/add", json={"repo": GATED, "name": "gated-Q4_K_M.gguf", "token": TOKEN}
        ).status_code
        == 201
    )
    assert api.post("/hf/search", json={"query": "gated", "token": TOKEN}).status_code == 200
    seen = [r["authorization"] for r in fake.requests]
    assert seen and all(a == f"Bearer {TOKEN}" for a in seen)
    argv = argv_log.read_text()
    assert f"/api/models/{GATED}/tree/main" in argv  # the listing went through curl (HFM-15)
    assert "/api/models?" in argv and TOKEN not in argv
    assert TOKEN not in caplog.text
    for stored in (tmp_path / "data").rglob("*"):
        if stored.is_file():
            assert TOKEN.encode() not in stored.read_bytes(), stored
    assert str(private / "miserver-hf-") in argv  # curl read the token from a file there
    assert not list(private.glob("miserver-hf-*.header"))


def test_inspect_reads_the_header_by_range_and_sets_it_against_this_machine(
    api: httpx.Client, hub: tuple[Hub, str], gguf_path: Path, tmp_path: Path
) -> None:
    """LOC-HFI-01, LOC-HFI-02, LOC-HFI-03, LOC-HFI-04, LOC-HFI-05, LOC-HFI-06, LOC-HFI-07,
    LOC-HFI-08, LOC-HFI-09, LOC-HFI-12, LOC-HFI-13, LOC-HFI-14, LOC-HFI-15, LOC-HFI-16,
    LOC-HFI-17, LOC-HFI-18, LOC-HFI-25, LOC-HFI-27, LOC-HFI-28: a model's header comes from a
    range request (never the whole file) and gives its facts (llama, 30 blocks, 576 wide,
    dense bytes the tensors' sum); the machine is measured with nothing loaded; the verdict
    is `plain mmap` with the disk and memory sentences; a copy already in the models
    directory counts as present; a projector is `not a model`, not downloadable; a header
    that does not parse is `not readable`; a name the listing lacks is 404; a header the
    site would not give is 502."""
    fake, _ = hub
    size = gguf_path.stat().st_size
    ask = {"repo": REPO, "name": "tiny-Q4_1.gguf"}
    found = api.post("/hf/inspect", json=ask).json()
    assert read_ranges(fake, "tiny-Q4_1.gguf")[-1][1] < size - 1  # never the whole file
    model = found["model"]
    assert (found["bytes"], found["files"], found["complete"]) == (size, 1, True)
    assert (model["readable"], model["arch"], model["role"], model["type"]) == (
        True,
        "llama",
        "model",
        "model",
    )
    assert (model["block_count"], model["n_layer"], model["n_embd"], model["is_moe"]) == (
        30,
        30,
        576,
        False,
    )
    assert 0.95 * size < model["dense_bytes"] < size and model["expert_bytes"] == 0
    assert model["token_cycle_bytes"] == model["dense_bytes"]
    machine, verdict = found["machine"], found["verdict"]
    assert (machine["loaded_model"], machine["loaded_held"], machine["present_bytes"]) == ("", 0, 0)
    assert machine["budget_if_loaded"] <= machine["memory_total"]
    assert (verdict["mode"], verdict["downloadable"]) == ("plain mmap", True)
    assert re.fullmatch(
        rf"needs {size >> 20} MiB of disk; the models folder has \d+ MiB free", verdict["disk"]
    )
    assert verdict["memory"].startswith("fits: its weights take ")
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "tiny-Q4_1.gguf").write_bytes(gguf_path.read_bytes())
    again = api.post("/hf/inspect", json=ask).json()
    assert again["machine"]["present_bytes"] == size
    assert again["verdict"]["disk"].startswith("needs 0 MiB of disk")
    projector = api.post("/hf/inspect", json={"repo": REPO, "name": "mmproj-tiny-f16.gguf"}).json()
    assert projector["model"]["role"] == "projector"
    assert (projector["verdict"]["mode"], projector["verdict"]["downloadable"]) == (
        "not a model",
        False,
    )
    assert "projector" in projector["verdict"]["memory"]
    broken = api.post("/hf/inspect", json={"repo": REPO, "name": "draft-tiny-Q8_0.gguf"}).json()
    assert broken["model"]["readable"] is False and broken["verdict"]["mode"] == "not readable"
    missing = api.post("/hf/inspect", json={"repo": REPO, "name": "nope.gguf"})
    assert missing.status_code == 404
    fake.faults["tiny-Q4_1.gguf"] = Fault(status=500)
    unfetched = api.post("/hf/inspect", json=ask)
    assert (unfetched.status_code, unfetched.json()["error"]["code"]) == (502, "upstream_error")


def read_ranges(fake: Hub, path: str) -> list[tuple[int, int]]:
    """The byte ranges the server asked `path` for, in order: contiguous from 0 (each read
    takes only bytes not read yet)."""
    ranges = []
    for request in fake.requests:
        if request["path"] == path:
            value = request["range"]
            assert value is not None and value.startswith("bytes=")
            first, last = value.removeprefix("bytes=").split("-")
            ranges.append((int(first), int(last)))
    assert ranges and ranges[0][0] == 0
    for before, after in itertools.pairwise(ranges):
        assert after[0] in (0, before[1] + 1), ranges  # the next bytes, or a new inspect
    return ranges


def test_inspect_reads_only_the_bytes_the_header_needs_and_retries_a_dropped_line(
    api: httpx.Client, hub: tuple[Hub, str], gguf_path: Path
) -> None:
    """Issue 47 item 5, LOC-HFI-02: the header is read by ranges that grow only while it runs
    past them (SmolLM2's header is 1.7 MiB: 1 MiB, then the next 3 MiB, never 48 MiB), and a
    line the site drops mid-range is tried again, as a download's is: the answer is whole."""
    fake, _ = hub
    ask = {"repo": REPO, "name": "tiny-Q4_1.gguf"}
    assert api.post("/hf/inspect", json=ask).json()["model"]["readable"] is True
    ranges = read_ranges(fake, "tiny-Q4_1.gguf")
    assert ranges == [(0, (1 << 20) - 1), (1 << 20, (4 << 20) - 1)]
    fake.requests.clear()
    fake.faults["tiny-Q4_1.gguf"] = Fault(drop_after=100_000, drops=2)
    again = api.post("/hf/inspect", json=ask)
    assert again.status_code == 200, again.text
    assert again.json()["model"]["block_count"] == 30
    retried = read_ranges(fake, "tiny-Q4_1.gguf")
    assert retried == [(0, (1 << 20) - 1)] * 3 + [(1 << 20, (4 << 20) - 1)]


def test_inspect_with_a_model_loaded_counts_that_a_load_unloads_it(
    api: httpx.Client, hub: tuple[Hub, str]
) -> None:
    """LOC-HFI-19, LOC-HFI-22, LOC-HFI-24: with the default model loaded (without a plan), the
    machine names it, `loaded_held` is 0, the figure is the measured one, and the memory
    sentence says it was measured with that model loaded."""
    assert api.post("/session/load", json={}, headers=JSON).status_code == 202
    deadline = time.monotonic() + WAIT_S
    while (info := api.get("/info").json())["state"] not in ("ready", "error"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert info["state"] == "ready", info
    loaded = info["model"]["id"]
    found = api.post("/hf/inspect", json={"repo": REPO, "name": "tiny-Q4_1.gguf"}).json()
    machine = found["machine"]
    assert (machine["loaded_model"], machine["loaded_held"]) == (loaded, 0)
    assert machine["budget_if_loaded"] == machine["residency_budget"]
    assert (
        f"(measured with {loaded} loaded; a load unloads it first)" in (found["verdict"]["memory"])
    )
