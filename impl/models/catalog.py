"""The download catalog (REQ-003 MODELS-28..37): the shipped entries, and their state on disk.

The shipped catalog is catalog.json beside this module, a `mi.catalog/v1`
document (spec/schemas/mi-catalog-v1.json), checked against its schema when
read; its sizes and SHA-256 sums are the Git LFS objects of the pinned
revisions. Each entry is a set of files in one Hugging Face repository at a
pinned revision; a file's URL is built on the endpoint the server runs with
(`<hf-endpoint>/<repo>/resolve/<revision>/<name>`, LOC-SEC-50), never taken
from a client.

An entry's state is read from the models directory every time, never kept
(LOC-MODELS-35): `received` counts complete files and `.part` files alike,
`partial` is true when it is `available` with a `.part` there, and it is
`on_disk` when every file is there whole.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import contract

log = logging.getLogger(__name__)
SCHEMA = "mi-catalog-v1.json"
PART = ".part"


class CatalogError(ValueError):
    """A catalog document that does not hold (the shipped one is a build fault)."""


@dataclass(frozen=True, slots=True)
class CatalogFile:
    name: str  # the file's name in the models directory
    bytes: int
    sha256: str | None = None
    path: str = ""  # its path in the repository (folders included); "" when it is `name`

    @property
    def repo_path(self) -> str:
        return self.path or self.name


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    id: str
    title: str
    quant: str
    repo: str
    revision: str
    files: tuple[CatalogFile, ...]
    blurb: str = ""
    note: str = ""
    added: bool = False

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def url(self, endpoint: str, file: CatalogFile) -> str:
        """The file's resolve URL on `endpoint` (the configured one)."""
        base = endpoint.rstrip("/")
        path = f"{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(file.repo_path)}"
        return f"{base}/{path}"


@dataclass(frozen=True, slots=True)
class OnDisk:
    """What of an entry the models directory holds."""

    complete: int  # files there whole
    received: int  # bytes: complete files and `.part` files
    parts: int  # `.part` files


def entries(document: Any, *, added: bool = False) -> list[Entry]:
    """The entries of a `mi.catalog/v1` document; CatalogError names the field at fault."""
    broken = contract.first_error(SCHEMA, document)
    if broken is not None:
        field, message = broken
        raise CatalogError(f"the catalog is invalid at `{field}`: {message}")
    found = [_entry(raw, added) for raw in document["models"]]
    ids = [e.id for e in found]
    if len(set(ids)) != len(ids):
        raise CatalogError(f"a catalog id is listed twice: {sorted(ids)}")
    return found


def _entry(raw: Mapping[str, Any], added: bool) -> Entry:
    return Entry(
        id=raw["id"],
        title=raw["title"],
        quant=raw.get("quant", ""),
        repo=raw["repo"],
        revision=raw["revision"],
        files=tuple(
            CatalogFile(f["name"], f["bytes"], f.get("sha256"), f.get("path", ""))
            for f in raw["files"]
        ),
        blurb=raw.get("blurb", ""),
        note=raw.get("note", ""),
        added=added,
    )


def shipped(path: Path | None = None) -> list[Entry]:
    """The catalog the package ships, or the operator's file at `path` instead."""
    if path is not None:
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(f"cannot read the catalog {path}: {exc}") from exc
    else:
        text = (resources.files("miserver.models") / "catalog.json").read_text("utf-8")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise CatalogError(f"the catalog {path or 'shipped'} is not JSON: {exc}") from exc
    return entries(document)


def on_disk(entry: Entry, models_dir: Path) -> OnDisk:
    """What of `entry` is in `models_dir` (its own files only, never a scan directory)."""
    complete = received = parts = 0
    for file in entry.files:
        whole = _size(models_dir / file.name)
        if whole is not None:
            complete += 1
            received += whole
            continue
        part = _size(models_dir / (file.name + PART))
        if part is not None:
            parts += 1
            received += part
    return OnDisk(complete, received, parts)


def _size(path: Path) -> int | None:
    try:
        found = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return found.st_size if os.path.isfile(path) and not os.path.islink(path) else None


def view(entry: Entry, models_dir: Path, endpoint: str, downloading: bool) -> dict[str, Any]:
    """The `CatalogEntry` of GET /api/models (LOC-MODELS-28..37)."""
    disk = on_disk(entry, models_dir)
    if downloading:
        status = "downloading"
    elif disk.complete == len(entry.files):
        status = "on_disk"
    else:
        status = "available"
    return {
        "id": entry.id,
        "title": entry.title,
        "quant": entry.quant,
        "file": entry.files[0].name,
        "bytes": entry.bytes,
        "files": [
            {"name": f.name, "bytes": f.bytes, "url": entry.url(endpoint, f), "sha256": f.sha256}
            for f in entry.files
        ],
        "blurb": entry.blurb,
        "status": status,
        "received": disk.received,
        "partial": status == "available" and disk.parts > 0,
        "note": entry.note,
        "added": entry.added,
    }


def document(found: Iterable[Entry]) -> dict[str, Any]:
    """The `mi.catalog/v1` document of `found` (what added-models.json holds)."""
    models = []
    for e in found:
        files = []
        for f in e.files:
            item: dict[str, Any] = {"name": f.name, "bytes": f.bytes}
            item |= {"sha256": f.sha256} if f.sha256 else {}
            item |= {"path": f.path} if f.path else {}
            files.append(item)
        models.append(
            {
                "id": e.id,
                "title": e.title,
                "quant": e.quant,
                "repo": e.repo,
                "revision": e.revision,
                "blurb": e.blurb,
                "note": e.note,
                "files": files,
            }
        )
    return {"schema": "mi.catalog/v1", "models": models}


class Catalog:
    """The shipped entries, then the added ones (POST /api/hf/add), by id. Added entries are
    kept in `added_file` (added-models.json beside settings.json), written atomically."""

    def __init__(self, shipped_entries: Sequence[Entry], added_file: Path | None = None) -> None:
        self._shipped = {e.id: e for e in shipped_entries}
        self._file = added_file
        self._added: dict[str, Entry] = {}
        if added_file is not None and added_file.is_file():
            try:
                kept = entries(json.loads(added_file.read_text("utf-8")), added=True)
            except (OSError, ValueError) as exc:  # CatalogError is a ValueError
                aside = added_file.with_name(added_file.name + ".bad")
                log.error("%s does not hold (%s); kept aside as %s", added_file, exc, aside.name)
                os.replace(added_file, aside)
                kept = []
            self._added = {e.id: e for e in kept if e.id not in self._shipped}

    def all(self) -> list[Entry]:
        return [*self._shipped.values(), *self._added.values()]

    def get(self, entry_id: str) -> Entry | None:
        return self._shipped.get(entry_id) or self._added.get(entry_id)

    def shipped(self, entry_id: str) -> bool:
        return entry_id in self._shipped

    def add(self, entry: Entry) -> None:
        """Add (or replace) an added entry, persisted; never a shipped id."""
        if entry.id in self._shipped:
            raise KeyError(entry.id)
        self._added[entry.id] = entry
        self._save()

    def forget(self, entry_id: str) -> None:
        """Drop an added entry (KeyError for any other id); its files stay on disk."""
        del self._added[entry_id]
        self._save()

    def _save(self) -> None:
        if self._file is None:
            return
        self._file.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document(self._added.values()), indent=2) + "\n"
        handle, staging = tempfile.mkstemp(prefix=".added-", dir=self._file.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(staging, self._file)
