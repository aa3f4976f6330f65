"""Catalog downloads over real HTTP against a fake Hugging Face site on loopback
(REQ-003 MODELS-28..37, DL-01..19, PART-01..07, SEC-43..47, EVENTS-18/19; issue 20).

The server runs under uvicorn with `--catalog` naming a catalog whose entries
live on the fake hub (tools/fakehub.py), `--hf-endpoint` pointing at it, and
short retry waits. Files are real bytes: the embedded SmolLM2 GGUF, and split
sets cut from random bytes. Progress is read from GET /api/events as a client
would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from miserver.app import Server
from miserver.models.catalog import shipped
from miserver.settings import Settings
from tests.conftest import JSON, TIMING, cache_dir
from tests.events import Events
from tests.prometheus import samples
from tools.fakehub import Fault, Hub, serve_hub
from tools.uvicorn_thread import uvicorn_serving

pytestmark = pytest.mark.xdist_group(TIMING)  # transfer rates and event pacing

REPO = "fake-org/tiny-GGUF"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SPLIT = [f"tiny-split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
WAIT_S = 60.0


@pytest.fixture(scope="module")
def gguf_bytes(gguf_path: Path) -> bytes:
    return gguf_path.read_bytes()


@pytest.fixture
def hub(gguf_bytes: bytes) -> Iterator[tuple[Hub, str]]:
    hub = Hub()
    hub.add(REPO, "tiny.gguf", gguf_bytes)
    pieces = [os.urandom(700_000), os.urandom(500_000), os.urandom(300_000)]
    for name, piece in zip(SPLIT, pieces, strict=True):
        hub.add(REPO, name, piece)
    with serve_hub(hub) as base:
        yield hub, base


def catalog(hub: Hub, *, sha: str | None = None) -> dict[str, Any]:
    files = hub.repos[REPO]
    tiny = files["tiny.gguf"]
    return {
        "schema": "mi.catalog/v1",
        "models": [
            {
                "id": "tiny",
                "title": "Tiny",
                "quant": "Q4_1",
                "repo": REPO,
                "revision": REVISION,
                "blurb": "the test model",
                "files": [
                    {
                        "name": "tiny.gguf",
                        "bytes": len(tiny),
                        "sha256": sha or hashlib.sha256(tiny).hexdigest(),
                    }
                ],
            },
            {
                "id": "split",
                "title": "Split",
                "quant": "Q8_0",
                "repo": REPO,
                "revision": REVISION,
                "files": [{"name": n, "bytes": len(files[n])} for n in SPLIT],
            },
        ],
    }


class Running:
    def __init__(self, base: str, models: Path, app: Server) -> None:
        self.base = base
        self.models = models
        self.app = app
        self.api = httpx.Client(base_url=f"{base}/api", timeout=WAIT_S)

    def entry(self, entry_id: str) -> dict[str, Any]:
        listing = self.api.get("/models").json()
        return next(e for e in listing["catalog"] if e["id"] == entry_id)

    def start(self, entry_id: str) -> httpx.Response:
        return self.api.post("/models/download", json={"id": entry_id})

    def wait_state(self, events: Events, entry_id: str, state: str) -> dict[str, Any]:
        def ended(seen: list[tuple[str, dict[str, Any]]]) -> bool:
            return any(
                n == "download" and d["id"] == entry_id and d["state"] == state for n, d in seen
            )

        events.wait_for(ended)
        return next(
            d
            for n, d in events.seen
            if n == "download" and d["id"] == entry_id and d["state"] == state
        )


@pytest.fixture
def server(
    tmp_path: Path, hub: tuple[Hub, str], request: pytest.FixtureRequest
) -> Iterator[Running]:
    fake, base = hub
    sha = getattr(request, "param", None)
    catalog_file = tmp_path / "catalog.json"
    catalog_file.write_text(json.dumps(catalog(fake, sha=sha)))
    models = tmp_path / "models"
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=models,
        scan_dirs=(tmp_path / "scan",),
        hf_endpoint=base,
        catalog_file=catalog_file,
        download_retry_wait_s=0.05,
        download_retry_wait_max_s=0.2,
    )
    app = Server(settings, preload=False)
    with uvicorn_serving(app, graceful_s=1.0) as port:
        running = Running(f"http://127.0.0.1:{port}", models, app)
        yield running
        running.api.close()


def test_the_shipped_catalog_lists_real_models_on_the_configured_endpoint(tmp_path: Path) -> None:
    """LOC-MODELS-28, LOC-MODELS-29, LOC-MODELS-30, LOC-MODELS-31, LOC-MODELS-32, LOC-SEC-50, issue
    20 item 1: the shipped catalog holds small real GGUF models, each file with its size and
    SHA-256, and GET /api/models lists each entry with its files' resolve URLs on the configured
    endpoint, `available`, nothing received."""
    entries = shipped()
    assert len(entries) >= 5 and all(f.sha256 for e in entries for f in e.files)
    assert {"qwen2.5-1.5b-instruct-q4_k_m", "smollm2-135m-instruct-q4_k_m"} <= {
        e.id for e in entries
    }
    settings = Settings(
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=tmp_path / "models",
        hf_endpoint="https://mirror.example",
    )
    with uvicorn_serving(Server(settings, preload=False)) as port:
        listing = httpx.get(f"http://127.0.0.1:{port}/api/models").json()
    views = {e["id"]: e for e in listing["catalog"]}
    first = entries[0]
    view = views[first.id]
    assert view["file"] == first.files[0].name and view["bytes"] == first.bytes
    assert view["files"][0]["url"] == (
        f"https://mirror.example/{first.repo}/resolve/{first.revision}/{first.files[0].name}"
    )
    assert set(view) >= {
        "id",
        "title",
        "quant",
        "file",
        "bytes",
        "files",
        "blurb",
        "status",
        "received",
        "partial",
        "note",
    }
    assert [f["name"] for f in view["files"]] == [f.name for f in first.files]
    assert {v["status"] for v in views.values()} <= {"on_disk", "downloading", "available"}
    assert (view["status"], view["received"], view["partial"], view["added"]) == (
        "available",
        0,
        False,
        False,
    )


def downloads_ended(server: Running) -> dict[str, float]:
    """`miserver_downloads_total` by outcome, from /metrics (issue 47)."""
    found = samples(httpx.get(f"{server.base}/metrics").text, "miserver_downloads_total")
    return {s.labels["outcome"]: s.value for s in found}


def test_a_download_interrupted_three_times_finishes_whole(
    server: Running, hub: tuple[Hub, str], gguf_bytes: bytes
) -> None:
    """LOC-DL-01, LOC-DL-02, LOC-DL-03, LOC-DL-04, LOC-DL-05, LOC-DL-06, LOC-DL-09, LOC-DL-10,
    LOC-DL-11, LOC-DL-12, LOC-DL-15, LOC-DL-16, LOC-EVENTS-18, LOC-EVENTS-19, LOC-MODELS-16: the
    line dropped three times mid-file, each retried from the `.part` (a Range request from its
    size) while the event stays `running` with the failure in `error`; the file ends whole (the
    right bytes), renamed from `.part`, `on_disk`, and in /v1/models at once."""
    fake, _ = hub
    fake.faults["tiny.gguf"] = Fault(drop_after=len(gguf_bytes) // 5, drops=3)
    ended = downloads_ended(server)
    with Events(server.base) as events:
        started = server.start("tiny")
        assert (started.status_code, started.json()) == (202, {"id": "tiny", "state": "running"})
        done = server.wait_state(events, "tiny", "done")
    assert done["received"] == done["total"] == len(gguf_bytes)
    assert downloads_ended(server)["done"] == ended.get("done", 0) + 1  # issue 47: one job
    retries = [
        d for n, d in events.seen if n == "download" and d["state"] == "running" and d["error"]
    ]
    assert [d["attempt"] for d in retries] == [1, 2, 3]
    assert [d["retry_in_s"] for d in retries] == [0.05, 0.1, 0.2]  # doubling, capped
    ranges = [r["range"] for r in fake.requests if r["path"] == "tiny.gguf"]
    assert (
        ranges[0] is None
        and len(ranges) == 4
        and all(r and r.startswith("bytes=") for r in ranges[1:])
    )
    assert (server.models / "tiny.gguf").read_bytes() == gguf_bytes
    assert not (server.models / "tiny.gguf.part").exists()
    entry = server.entry("tiny")
    assert (entry["status"], entry["received"], entry["partial"]) == (
        "on_disk",
        len(gguf_bytes),
        False,
    )
    ids = [m["id"] for m in httpx.get(f"{server.base}/v1/models").json()["data"]]
    assert any(i.startswith("tiny") for i in ids), ids


def test_progress_events_carry_the_rate_and_eta_at_most_four_a_second(
    server: Running, hub: tuple[Hub, str]
) -> None:
    """LOC-DL-04, LOC-EVENTS-18, LOC-EVENTS-19, issue 20 item 2 (events with bytes/s and ETA at
    most a few times a second): a file the site sends at about 400 kB/s gives `running`
    events, at most four a second, whose `bytes_per_s` is near that rate and whose `eta_s`
    is what is left at that rate; the last event is `done`."""
    fake, _ = hub
    rate = 400_000
    fake.faults[SPLIT[0]] = Fault(rate=rate)
    with Events(server.base) as events:
        began = time.monotonic()
        assert server.start("split").status_code == 202
        server.wait_state(events, "split", "done")
        took = time.monotonic() - began
    downloads = [d for n, d in events.seen if n == "download"]
    running = [d for d in downloads if d["state"] == "running"]
    assert took >= len(fake.repos[REPO][SPLIT[0]]) / rate * 0.9
    assert 3 <= len(running) <= 4 * took + 3  # one first event per file, then four a second
    assert downloads[-1]["state"] == "done" and {d["state"] for d in running} == {"running"}
    assert set(downloads[0]) >= {"id", "file", "received", "total", "state", "error"}
    steady = [d for d in running if d["file"] == SPLIT[0] and d["received"] >= 200_000]
    assert steady and all(0.4 * rate < d["bytes_per_s"] < 1.6 * rate for d in steady)
    for d in steady:
        assert d["eta_s"] == pytest.approx((d["total"] - d["received"]) / d["bytes_per_s"])


@pytest.mark.parametrize("server", ["0" * 64], indirect=True)
def test_a_checksum_mismatch_is_an_error_and_never_a_model(server: Running) -> None:
    """Issue 20 item 2 (checksums verified when known), LOC-DL-13: a file whose SHA-256 is
    not the catalog's ends the download in `error` naming the file; the bad bytes are kept
    aside as `.bad`, never renamed into place nor listed as a model."""
    ended = downloads_ended(server)
    with Events(server.base) as events:
        assert server.start("tiny").status_code == 202
        failed = server.wait_state(events, "tiny", "error")
    assert "tiny.gguf" in failed["error"] and "SHA-256" in failed["error"]
    assert downloads_ended(server)["error"] == ended.get("error", 0) + 1  # issue 47
    assert (server.models / "tiny.gguf.bad").is_file()
    assert not (server.models / "tiny.gguf").exists()
    assert server.entry("tiny")["status"] == "available"
    ids = [m["id"] for m in httpx.get(f"{server.base}/v1/models").json()["data"]]
    assert not any(i.startswith("tiny") for i in ids)


def test_a_refusal_of_the_site_ends_at_once_and_keeps_the_part(
    server: Running, hub: tuple[Hub, str]
) -> None:
    """LOC-DL-13, LOC-MODELS-33, LOC-MODELS-34, LOC-MODELS-35: a 404 from the site is not retried:
    `error` at once naming the file; a `.part` already there stays and still counts as received."""
    fake, _ = hub
    server.models.mkdir(parents=True, exist_ok=True)
    (server.models / SPLIT[1]).with_suffix(".gguf.part").write_bytes(b"x" * 1000)
    fake.faults[SPLIT[0]] = Fault(status=404)
    with Events(server.base) as events:
        assert server.start("split").status_code == 202
        failed = server.wait_state(events, "split", "error")
    assert SPLIT[0] in failed["error"] and "404" in failed["error"]
    assert len([r for r in fake.requests if r["path"] == SPLIT[0]]) == 1
    entry = server.entry("split")
    assert (entry["status"], entry["received"], entry["partial"]) == ("available", 1000, True)


def test_cancel_keeps_the_part_and_a_new_start_resumes(
    server: Running, hub: tuple[Hub, str]
) -> None:
    """LOC-DL-06, LOC-DL-16, LOC-DL-17, LOC-DL-18, LOC-DL-19, LOC-MODELS-34, LOC-MODELS-35,
    LOC-MODELS-36, LOC-SEC-44: while the site stalls mid-file the entry is `downloading` and a
    second start is a 202 no-op; a cancel sends `cancelled` and keeps the `.part` (`partial`,
    `received` from disk); starting again resumes from it (Range from its size) and ends `on_disk`
    with every shard whole."""
    fake, _ = hub
    fake.faults[SPLIT[0]] = Fault(stall=200_000)
    with Events(server.base) as events:
        assert server.start("split").status_code == 202
        events.wait_for(
            lambda seen: any(
                n == "download" and d["state"] == "running" and d["received"] >= 200_000
                for n, d in seen
            )
        )
        assert server.entry("split")["status"] == "downloading"
        assert server.start("split").status_code == 202
        assert server.api.delete("/models/download/split", headers=JSON).json() == {"ok": True}
        server.wait_state(events, "split", "cancelled")
    entry = server.entry("split")
    assert (entry["status"], entry["partial"]) == ("available", True)
    assert entry["received"] == (server.models / f"{SPLIT[0]}.part").stat().st_size >= 200_000
    fake.release.set()
    with Events(server.base) as events:
        assert server.start("split").status_code == 202
        server.wait_state(events, "split", "done")
    assert [r["range"] for r in fake.requests if r["path"] == SPLIT[0]][-1] == (
        f"bytes={entry['received']}-"
    )
    for name in SPLIT:
        assert (server.models / name).read_bytes() == fake.repos[REPO][name]
    assert server.entry("split")["status"] == "on_disk"
    missing = server.api.delete("/models/download/split", headers=JSON)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_a_job_s_last_event_finds_it_ended(server: Running, hub: tuple[Hub, str]) -> None:
    """LOC-DL-17, LOC-MODELS-34: when a job's last event (`cancelled`, `done`) is sent, the
    entry no longer counts as downloading, so a client that lists the catalog on that event
    reads the entry's new status (the web UI does), never a stale `downloading`."""
    fake, _ = hub
    fake.faults[SPLIT[0]] = Fault(stall=200_000)
    state = server.app.state
    ends: list[tuple[str, bool]] = []

    def observe(data: dict[str, Any]) -> None:
        if data["state"] in ("cancelled", "done", "error"):
            ends.append((data["state"], state.downloads.running(data["id"])))

    server.app.bus.tap("download", observe)
    with Events(server.base) as events:
        assert server.start("split").status_code == 202
        events.wait_for(
            lambda seen: any(n == "download" and d["received"] >= 200_000 for n, d in seen)
        )
        assert server.api.delete("/models/download/split", headers=JSON).status_code == 200
        server.wait_state(events, "split", "cancelled")
        fake.release.set()
        assert server.start("split").status_code == 202
        server.wait_state(events, "split", "done")
    assert ends == [("cancelled", False), ("done", False)]


def test_no_space_is_507_and_writes_nothing(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LOC-DL-07, LOC-DL-08, REQ-003 open point 25: with less free space than the entry
    needs, the start is 507 `no_space` saying `needs X GB more, only Y GB free` in decimal
    GB, and nothing lands in the models directory."""
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(
        "miserver.models.downloads.shutil.disk_usage",
        lambda _: usage._replace(free=100_000),
    )
    refused = server.start("split")
    assert refused.status_code == 507, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["message"]) == ("no_space", "needs 0.0 GB more, only 0.0 GB free")
    assert not any(server.models.iterdir())


def test_partial_delete_frees_only_part_files(server: Running, hub: tuple[Hub, str]) -> None:
    """LOC-PART-01, LOC-PART-02, LOC-PART-03, LOC-PART-04, LOC-PART-05, LOC-PART-06, LOC-PART-07,
    LOC-SEC-45, LOC-SEC-46, LOC-MODELS-15, LOC-MODELS-33: deleting an entry's partial download
    removes the `.part` of each file it names in the models directory and nothing else (a complete
    shard stays; a scan directory is never counted nor touched), answers the bytes freed (0 the
    second time), 404 for an unknown id, 409 while it downloads."""
    fake, _ = hub
    server.models.mkdir(parents=True, exist_ok=True)
    (server.models / SPLIT[0]).write_bytes(fake.repos[REPO][SPLIT[0]])
    (server.models / f"{SPLIT[1]}.part").write_bytes(b"p" * 4321)
    (server.models / "other.gguf.part").write_bytes(b"q" * 10)
    scan = server.models.parent / "scan"
    scan.mkdir()
    (scan / f"{SPLIT[1]}.part").write_bytes(b"s" * 99)  # never counted, never deleted
    (scan / SPLIT[2]).write_bytes(b"s" * 7)
    assert server.entry("split")["received"] == len(fake.repos[REPO][SPLIT[0]]) + 4321
    freed = server.api.delete("/models/partial/split", headers=JSON)
    assert freed.json() == {"ok": True, "freed": 4321}
    assert server.api.delete("/models/partial/split", headers=JSON).json()["freed"] == 0
    assert (server.models / SPLIT[0]).is_file() and (server.models / "other.gguf.part").is_file()
    assert (scan / f"{SPLIT[1]}.part").is_file() and (scan / SPLIT[2]).is_file()
    entry = server.entry("split")
    assert (entry["partial"], entry["received"]) == (False, len(fake.repos[REPO][SPLIT[0]]))
    unknown = server.api.delete("/models/partial/nope", headers=JSON)
    assert unknown.status_code == 404
    fake.faults[SPLIT[1]] = Fault(stall=1000)
    assert server.start("split").status_code == 202
    deadline = time.monotonic() + WAIT_S
    while server.entry("split")["status"] != "downloading":
        assert time.monotonic() < deadline
    busy = server.api.delete("/models/partial/split", headers=JSON)
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "downloading")
    fake.release.set()


def test_downloads_take_a_catalog_id_only(server: Running) -> None:
    """LOC-SEC-43, LOC-DL-01, REQ-003 open point 8: an unknown id is 404 `not_found`; a URL
    or a path in place of the id is just an unknown id; no other field is read."""
    for sent in ("nope", "https://evil.example/x.gguf", "../../etc/passwd"):
        refused = server.start(sent)
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found")
    assert not server.models.exists() or not any(server.models.iterdir())


def test_six_failed_attempts_end_in_error_keeping_the_part(
    server: Running, hub: tuple[Hub, str], gguf_bytes: bytes
) -> None:
    """LOC-DL-10, LOC-DL-12, LOC-DL-14: a line that fails on every attempt is tried six
    times (five `running` events carrying the failure in `error`, each after a wait), then
    ends in `error` with the `.part` kept for a later start."""
    fake, _ = hub
    fake.faults["tiny.gguf"] = Fault(drop_after=100_000, drops=6)
    with Events(server.base) as events:
        assert server.start("tiny").status_code == 202
        failed = server.wait_state(events, "tiny", "error")
    assert "tiny.gguf" in failed["error"]
    retries = [
        d["attempt"]
        for n, d in events.seen
        if n == "download" and d["state"] == "running" and d["error"]
    ]
    assert retries == [1, 2, 3, 4, 5]
    assert len([r for r in fake.requests if r["path"] == "tiny.gguf"]) == 6
    assert (server.models / "tiny.gguf.part").stat().st_size >= 100_000
    assert server.entry("tiny")["partial"] is True
