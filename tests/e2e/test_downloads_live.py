"""A download survives `kill -9` of the server: `miserver serve` as a subprocess against the
fake hub (REQ-003 DL-06, MODELS-35; issue 20 acceptance)."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import live_server
from tools.fakehub import Fault, Hub, serve_hub

pytestmark = pytest.mark.e2e

REPO = "fake-org/tiny-GGUF"


def test_a_killed_server_leaves_a_part_the_next_start_resumes(
    tmp_path: Path, gguf_path: Path
) -> None:
    """LOC-DL-05, LOC-DL-06, LOC-MODELS-35, LOC-MODELS-36: `kill -9` mid-file leaves the
    `.part` (and no curl writing on: it dies with the server); after a restart the entry
    shows `partial` with `received` from the disk, and starting it again asks the site
    for the rest only (Range from the `.part`'s size) and ends with the right bytes."""
    data = gguf_path.read_bytes()
    hub = Hub()
    digest = hub.add(REPO, "tiny.gguf", data)
    hub.faults["tiny.gguf"] = Fault(stall=len(data) // 3)
    file = {"name": "tiny.gguf", "bytes": len(data), "sha256": digest}
    entry = {"id": "tiny", "title": "Tiny", "quant": "Q4_1", "repo": REPO, "revision": "main"}
    entry["files"] = [file]
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"schema": "mi.catalog/v1", "models": [entry]}))
    models = tmp_path / "models"
    part = models / "tiny.gguf.part"
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    with serve_hub(hub) as base:
        args = ["--catalog", str(catalog), "--hf-endpoint", base, "--models-dir", str(models)]
        with live_server(tmp_path / "first", model=None, args=args) as server:
            api = server.base_url.removesuffix("/v1") + "/api"
            assert httpx.post(f"{api}/models/download", json={"id": "tiny"}).status_code == 202
            deadline = time.monotonic() + 60
            while not part.is_file() or part.stat().st_size < len(data) // 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=30)
        held = part.stat().st_size
        hub.release.set()
        time.sleep(1.0)  # an orphan curl would go on writing now
        assert part.stat().st_size == held and not (models / "tiny.gguf").exists()
        with live_server(tmp_path / "second", model=None, args=args) as server:
            api = server.base_url.removesuffix("/v1") + "/api"
            listed = httpx.get(f"{api}/models").json()["catalog"][0]
            assert (listed["partial"], listed["received"]) == (True, held)
            assert httpx.post(f"{api}/models/download", json={"id": "tiny"}).status_code == 202
            deadline = time.monotonic() + 60
            while httpx.get(f"{api}/models").json()["catalog"][0]["status"] != "on_disk":
                assert time.monotonic() < deadline
                time.sleep(0.1)
    assert hub.requests[-1]["range"] == f"bytes={held}-"
    assert hashlib.sha256((models / "tiny.gguf").read_bytes()).hexdigest() == digest
