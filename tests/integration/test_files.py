"""The Files API's refusals, its security rule and its persistence (issue 50 item 1, contract
0.30.0), in process: a multipart upload needs the Authorization header a cross-site form
cannot send; a JSON upload is the same file; a wrong purpose, an empty name or too many
bytes are refused before anything is kept; the files outlive a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miserver.app import Server
from miserver.settings import Settings
from tests.conftest import JSON, LocalClient, cache_dir

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
AUTH = {"Authorization": "Bearer anything"}  # what an SDK sends with no key configured


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path / "data", cache_dir=cache_dir(), **extra)


def _form(client: Any, headers: dict[str, str], purpose: str = "batch") -> Any:
    files = {"file": ("in.jsonl", LINE, "application/jsonl")}
    return client.post("/v1/files", files=files, data={"purpose": purpose}, headers=headers)


def test_a_form_upload_needs_an_authorization_header(tmp_path: Path) -> None:
    """LOC-SEC-25 kept: multipart/form-data without Authorization (what a cross-site HTML
    form sends) is 415 naming Content-Type, and nothing is kept; with it, the file is kept;
    a foreign Origin is refused first, header or not."""
    with LocalClient(Server(_settings(tmp_path), preload=False)) as client:
        refused = _form(client, {})
        assert refused.status_code == 415
        error = refused.json()["error"]
        assert error["param"] == "Content-Type" and "Authorization" in error["message"]
        assert client.get("/v1/files").json()["data"] == []
        foreign = _form(client, {**AUTH, "Origin": "https://evil.example"})
        assert foreign.status_code == 403
        kept = _form(client, AUTH)
        assert kept.status_code == 200, kept.text
        assert client.get(f"/v1/files/{kept.json()['id']}/content").content == LINE


def test_a_json_upload_is_the_same_file(tmp_path: Path) -> None:
    """The JSON form of an upload (`purpose`, `filename`, `content`) keeps the same bytes."""
    with LocalClient(Server(_settings(tmp_path), preload=False)) as client:
        body = {"purpose": "batch", "filename": "in.jsonl", "content": LINE.decode()}
        made = client.post("/v1/files", json=body, headers=JSON)
        assert made.status_code == 200, made.text
        assert made.json()["bytes"] == len(LINE)
        assert client.get(f"/v1/files/{made.json()['id']}/content").content == LINE


@pytest.mark.parametrize(
    ("purpose", "status", "param"),
    [("fine-tune", 400, "purpose"), ("batch", 413, "file")],
)
def test_a_refused_upload_keeps_nothing(
    tmp_path: Path, purpose: str, status: int, param: str
) -> None:
    """A purpose other than `batch` is 400 naming `purpose`; a file over FILES_MAX_BYTES is
    413 naming `file`; neither keeps anything."""
    settings = _settings(tmp_path, files_max_bytes=len(LINE) - 1)
    with LocalClient(Server(settings, preload=False)) as client:
        refused = _form(client, AUTH, purpose)
        assert refused.status_code == status, refused.text
        assert refused.json()["error"]["param"] == param
        assert client.get("/v1/files").json()["data"] == []
    assert not any((tmp_path / "data" / "files").glob("file-*"))


def test_files_outlive_a_restart_and_unknown_ids_are_404(tmp_path: Path) -> None:
    """Issue 50: a kept file is listed and readable after the server restarts; an unknown id
    is 404 `not_found` naming `file_id` on retrieve, content and delete."""
    settings = _settings(tmp_path)
    with LocalClient(Server(settings, preload=False)) as client:
        made = _form(client, AUTH).json()
    with LocalClient(Server(settings, preload=False)) as client:
        assert client.get(f"/v1/files/{made['id']}").json() == made
        assert client.get(f"/v1/files/{made['id']}/content").content == LINE
        for response in (
            client.get("/v1/files/file-none"),
            client.get("/v1/files/file-none/content"),
            client.delete("/v1/files/file-none", headers=JSON),
        ):
            assert response.status_code == 404
            assert response.json()["error"]["param"] == "file_id"
