"""What a GGUF file says about itself, read without loading any weights.

Only the key/value header is parsed (arrays are skipped, keeping their
length), so reading a file's facts costs milliseconds; the registry calls it
to name models `repo:QUANT` before anything loads. The format:
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import gguf

MAGIC = b"GGUF"
_FINGERPRINT_SPAN = 1 << 20
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class NotGGUF(ValueError):
    """The file is not a readable GGUF file."""


class HeaderCut(NotGGUF):
    """The data ends before the header does (a range read that stopped too soon)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFFacts:
    """The header facts the server needs: naming, fingerprints, window, template."""

    quantization: str
    architecture: str
    context_length: int
    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    metadata: dict[str, Any]


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    raw = handle.read(size)
    if len(raw) != size:
        raise HeaderCut("the header ends early")
    return struct.unpack(fmt, raw)[0]


def _string(handle: BinaryIO) -> str:
    length = _read(handle, "<Q")
    raw = handle.read(length)
    if len(raw) != length:
        raise HeaderCut("the header ends early")
    return raw.decode("utf-8", errors="replace")


def _value(handle: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(handle, _SCALARS[kind])
    if kind == _STRING:
        return _string(handle)
    if kind == _ARRAY:
        item, count = _read(handle, "<I"), _read(handle, "<Q")
        _skip(handle, item, count)
        return ("array", count)
    raise NotGGUF(f"unknown value type {kind}")


def _skip(handle: BinaryIO, kind: int, count: int) -> None:
    if kind in _SCALARS:
        handle.seek(struct.calcsize(_SCALARS[kind]) * count, 1)
        return
    if kind == _STRING:  # a vocabulary: length-prefixed strings, seeked over undecoded
        for _ in range(count):
            handle.seek(_read(handle, "<Q"), 1)
        return
    for _ in range(count):
        _value(handle, kind)


def read_metadata(path: Path) -> dict[str, Any]:
    """Every header key: scalars and strings as values, arrays as ("array", length)."""
    with path.open("rb") as handle:
        if handle.read(4) != MAGIC:
            raise NotGGUF(f"{path.name} does not start with the GGUF magic")
        version = _read(handle, "<I")
        if version not in (2, 3):
            raise NotGGUF(f"{path.name}: unsupported GGUF version {version}")
        _read(handle, "<Q")  # tensor count
        count = _read(handle, "<Q")
        return {_string(handle): _value(handle, _read(handle, "<I")) for _ in range(count)}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    kind: int  # the ggml type

    @property
    def bytes(self) -> int:
        """The tensor's size on disk (its ggml type's blocks)."""
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(self.kind)]
        count = 1
        for dim in self.shape:
            count *= dim
        return count // block * size


def read_header(handle: BinaryIO) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The key/value header and the tensor infos from a file's first bytes (a range read of
    a remote file will do); NotGGUF when they are not all there or not GGUF."""
    if handle.read(4) != MAGIC:
        raise NotGGUF("the data does not start with the GGUF magic")
    version = _read(handle, "<I")
    if version not in (2, 3):
        raise NotGGUF(f"unsupported GGUF version {version}")
    tensors, count = _read(handle, "<Q"), _read(handle, "<Q")
    meta = {_string(handle): _value(handle, _read(handle, "<I")) for _ in range(count)}
    infos = []
    for _ in range(tensors):
        name = _string(handle)
        dims = _read(handle, "<I")
        shape = tuple(_read(handle, "<Q") for _ in range(dims))
        kind = _read(handle, "<I")
        _read(handle, "<Q")  # offset
        try:
            gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise NotGGUF(f"tensor {name}: unknown ggml type {kind}") from None
        infos.append(TensorInfo(name, shape, kind))
    return meta, infos


def quantization_name(file_type: int | None) -> str:
    """`general.file_type` as llama.cpp names it (`Q4_1`), or `unrecorded`."""
    if file_type is None:
        return "unrecorded"
    try:
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except ValueError:
        return "unrecorded"


@lru_cache(maxsize=1024)
def _facts(path: Path, _size: int, _mtime: float) -> GGUFFacts | NotGGUF:
    """The facts, or the refusal: a file that is not GGUF is not read again while it is
    unchanged (a listing asks about every file, every time)."""
    try:
        meta = read_metadata(path)
    except NotGGUF as exc:
        return exc
    arch = str(meta.get("general.architecture", "unrecorded"))
    template = meta.get("tokenizer.chat_template")
    return GGUFFacts(
        quantization=quantization_name(meta.get("general.file_type")),
        architecture=arch,
        context_length=int(meta.get(f"{arch}.context_length", 0)),
        chat_template=template if isinstance(template, str) else None,
        bos_token_id=_int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int_or_none(meta.get("tokenizer.ggml.eos_token_id")),
        metadata=meta,
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


def facts(path: Path) -> GGUFFacts:
    """The header facts of `path` (cached while the file is unchanged); NotGGUF when it
    is not a readable GGUF file (cached too)."""
    stat = path.stat()
    found = _facts(path.resolve(), stat.st_size, stat.st_mtime)
    if isinstance(found, NotGGUF):
        raise NotGGUF(str(found))
    return found


def fingerprint(path: Path) -> str:
    """SHA-256 hex over the file's size, first MiB and last MiB: cheap and change-sensitive."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_FINGERPRINT_SPAN))
        handle.seek(max(0, size - _FINGERPRINT_SPAN))
        digest.update(handle.read(_FINGERPRINT_SPAN))
    return digest.hexdigest()
