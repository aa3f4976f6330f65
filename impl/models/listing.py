"""The `local` part of `GET /api/models`: every model on disk, read only.

    models dir, then each --scan-dir in order           (LOC-MODELS-04)
      <dir>/<file>.gguf                folder ""         (LOC-MODELS-07)
      <dir>/<folder>/<file>.gguf       folder "<folder>"
      <dir>/<folder>/config.json ...   an HF model folder, folder ""
      <dir>/<folder>/<deeper>/...      never listed      (LOC-MODELS-08)

A split set `<name>-00001-of-00003.gguf` is one entry, named by its lowest
present shard, `complete` once every shard is there (LOC-MODELS-05).
For every entry `path` is `dir`/`folder`/`name`. A link to a folder is never
followed (LOC-MODELS-09); a link to a file is listed by the link's own path,
as it cannot loop, and whether a client may open it is the confinement
rules' decision (LOC-MODELS-10). A `.part` file is a download, not a model.
A directory listed twice (the same resolved path) is read once; a missing or
unreadable directory lists nothing.

`role` comes from the GGUF header, never the name (LOC-MODELS-21); an
HF folder is a `model` when its `config.json` reads as an object, else `""`.
Only the header is read: nothing is loaded, written or downloaded.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines import gguf

_SPLIT = re.compile(r"^(?P<base>.+)-(?P<index>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
_HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
GGUF_FORMAT, HF_FORMAT = "gguf", "hf"


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalModel:
    """One model on disk: a GGUF file, a GGUF split set, or an HF model folder."""

    name: str
    path: str
    dir: str
    folder: str
    bytes: int
    shards: int
    files: tuple[str, ...]
    arch: str
    role: str
    format: str
    complete: bool

    @property
    def loadable(self) -> bool:
        """Whether it loads on its own: projectors, drafts and unreadable files do not."""
        return self.role == "model"

    def as_json(self) -> dict[str, Any]:
        """The wire object: the LOC-MODELS-11 keys, `format` and `loadable`."""
        return {
            "name": self.name,
            "path": self.path,
            "dir": self.dir,
            "folder": self.folder,
            "bytes": self.bytes,
            "shards": self.shards,
            "files": list(self.files),
            "arch": self.arch,
            "role": self.role,
            "streamable": False,  # LOC-MODELS-20 [adapt]: this build streams nothing
            "complete": self.complete,
            "format": self.format,
            "loadable": self.loadable,
        }


@dataclass(frozen=True, slots=True)
class _File:
    index: int
    path: str
    size: int


def list_local(models_dir: Path, scan_dirs: Sequence[Path]) -> list[LocalModel]:
    """Every model in the models directory, then in each scan directory (LOC-MODELS-04)."""
    found: list[LocalModel] = []
    seen: set[Path] = set()
    for root in (models_dir, *scan_dirs):
        resolved = root.resolve()
        if resolved not in seen:
            seen.add(resolved)
            found.extend(_list_dir(root))
    return found


def _list_dir(root: Path) -> list[LocalModel]:
    """`root`'s own files, then each folder directly inside it, by name (LOC-MODELS-07)."""
    top = _children(str(root))
    found = _gguf_models(top, str(root), "")
    for entry in top:
        if entry.is_dir(follow_symlinks=False):
            inside = _children(entry.path)
            hf = _hf_model(entry, inside, str(root))
            found.extend([hf] if hf is not None else [])
            found.extend(_gguf_models(inside, str(root), entry.name))
    return found


def _children(folder: str) -> list[os.DirEntry[str]]:
    """The entries of `folder` sorted by name; none when it is missing or unreadable."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except OSError:
        return []


def _files(entries: Iterable[os.DirEntry[str]]) -> list[tuple[os.DirEntry[str], int]]:
    """The plain files (or links to files) among `entries`, with their sizes."""
    found = []
    for entry in entries:
        try:
            if entry.is_file():
                found.append((entry, entry.stat().st_size))
        except OSError:
            continue
    return found


def _gguf_models(entries: list[os.DirEntry[str]], root: str, folder: str) -> list[LocalModel]:
    """The GGUF files among `entries`, a split set grouped into one entry (LOC-MODELS-05)."""
    groups: dict[tuple[str, int], list[_File]] = {}
    for entry, size in _files(entries):
        if entry.name.lower().endswith(".gguf"):
            key, index = shard(entry.name)
            groups.setdefault(key, []).append(_File(index, entry.path, size))
    return [
        _gguf_model(sorted(files, key=lambda f: f.index), total, root, folder)
        for (_, total), files in groups.items()
    ]


def shard(name: str) -> tuple[tuple[str, int], int]:
    """`((set, shard count), index)`: `a-00002-of-00003.gguf` -> `(("a-", 3), 2)`.

    A single file is a set of one keyed by its full name (which ends in `.gguf`, so it
    never equals a split set's key, whose name part ends in `-`).
    """
    split = _SPLIT.match(name)
    if split is not None and 1 <= int(split["index"]) <= int(split["total"]):
        return (split["base"] + "-", int(split["total"])), int(split["index"])
    return (name, 1), 1


def _gguf_model(files: list[_File], total: int, root: str, folder: str) -> LocalModel:
    first = Path(files[0].path)
    arch, role = gguf_header(first)
    return LocalModel(
        name=first.name,
        path=files[0].path,
        dir=root,
        folder=folder,
        bytes=sum(f.size for f in files),
        shards=total,
        files=tuple(f.path for f in files),
        arch=arch,
        role=role,
        format=GGUF_FORMAT,
        complete={f.index for f in files} == set(range(1, total + 1)),
    )


def architecture(path: Path) -> str:
    """The architecture a model's own files name: an HF folder's `model_type`, a GGUF's
    header (read through the cached facts); "" when unreadable."""
    if path.is_dir():
        config = _json_object(path / "config.json")
        arch = config.get("model_type") if config is not None else None
        return arch if isinstance(arch, str) else ""
    return gguf_header(path)[0]


def gguf_header(path: Path) -> tuple[str, str]:
    """`(arch, role)` from a GGUF header; `("", "")` when it cannot be read (LOC-MODELS-26)."""
    try:
        meta = gguf.facts(path).metadata
    except (OSError, ValueError, TypeError, OverflowError, MemoryError):
        return "", ""
    arch = meta.get("general.architecture")
    return (arch if isinstance(arch, str) else ""), gguf_role(meta)


def gguf_role(meta: dict[str, Any]) -> str:
    """What a readable header says the file is for (LOC-MODELS-22)."""
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    kind = meta.get("general.type")
    if kind == "mmproj" or arch == "clip":
        return "projector"
    blocks = meta.get(f"{arch}.block_count")
    blocks = blocks if isinstance(blocks, int) and not isinstance(blocks, bool) else None
    if f"{arch}.target_layers" in meta:
        return "draft"
    if blocks and meta.get(f"{arch}.nextn_predict_layers") == blocks:
        return "draft"
    if kind not in (None, "model") or blocks is None:
        return "other"
    return "model"


def _hf_model(
    folder: os.DirEntry[str], entries: list[os.DirEntry[str]], root: str
) -> LocalModel | None:
    """An HF model folder (`config.json` beside weights) as one entry, or None."""
    present = [(e, size) for e, size in _files(entries) if not _gguf_or_part(e.name)]
    names = {e.name for e, _ in present}
    weights = {n for n in names if n.endswith(".safetensors") or _is_bin_weight(n)}
    if "config.json" not in names or not weights:
        return None
    config = _json_object(Path(folder.path, "config.json"))
    expected = _indexed_weights(Path(folder.path)) or weights
    arch = config.get("model_type") if config is not None else None
    return LocalModel(
        name=folder.name,
        path=folder.path,
        dir=root,
        folder="",
        bytes=sum(size for _, size in present),
        shards=len(expected),
        files=tuple(e.path for e, _ in present),
        arch=arch if isinstance(arch, str) else "",
        role="model" if config is not None else "",
        format=HF_FORMAT,
        complete=expected <= weights,
    )


def _gguf_or_part(name: str) -> bool:
    """GGUF files in an HF folder are entries of their own; `.part` files are downloads."""
    return name.lower().endswith((".gguf", ".part"))


def _is_bin_weight(name: str) -> bool:
    return name.startswith("pytorch_model") and name.endswith(".bin")


def _indexed_weights(folder: Path) -> set[str]:
    """The weight files a sharded checkpoint's index names (none without an index)."""
    for index in _HF_INDEXES:
        data = _json_object(folder / index)
        weight_map = data.get("weight_map") if data is not None else None
        if isinstance(weight_map, dict):
            return {str(name) for name in weight_map.values()}
    return set()


def _json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file's content; None when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
