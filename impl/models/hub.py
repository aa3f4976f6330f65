"""The Hugging Face site, as the /api/hf routes read it (REQ-003 HFS, HFM, HFA; SEC-48..55).

Every request goes to the one endpoint the server runs with (`--hf-endpoint`):
a URL a client sends is only parsed for its repository, revision and file, and
the request is rebuilt on that endpoint (LOC-SEC-50/51). Repository ids and
file names are validated before anything is fetched (LOC-SEC-48/49). Requests
go through the system `curl`, as downloads do (LOC-HFM-15); a token travels
to `curl` in a header file only this process can read, never on its command
line, and is kept nowhere after the request (LOC-SEC-52..55).

The shapes read are the site's: `GET /api/models?search=...&expand[]=...`
(a list of `{id, downloads, likes, lastModified, gated}`) and
`GET /api/models/<repo>/tree/<revision>?recursive=true` (a list of
`{type, path, size, lfs: {oid, size}}`), the ones `huggingface_hub`'s
`list_models` and `list_repo_tree` read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from ..errors import ApiError
from . import curl
from .listing import shard

SITE_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})
PART = re.compile(r"^[A-Za-z0-9._+-]+$")  # one segment of a repository id or a file path
QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|F32|BF16|MXFP4)(?![A-Za-z0-9])", re.IGNORECASE
)
DRAFT_PREFIXES = ("mtp-", "dflash-", "draft-")
SEARCH_LIMIT = 20
SPAN_WAITS = (0.25, 0.5, 1.0)  # before each new try of a header read whose line failed
EXPAND = ("downloads", "likes", "lastModified", "gated")


@dataclass(frozen=True, slots=True)
class Target:
    """What a client's text names: a repository, a revision and maybe a file."""

    repo: str
    revision: str = "main"
    file: str = ""


@dataclass(frozen=True, slots=True)
class RepoFile:
    path: str
    bytes: int
    sha256: str | None


@dataclass(frozen=True, slots=True)
class HubModel:
    """A model of a repository listing: one file, or a split set named by its first shard."""

    name: str
    files: tuple[RepoFile, ...]
    count: int  # shards the names say the set has
    role: str

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.count

    @property
    def quant(self) -> str:
        return quant_of(self.name)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "quant": self.quant,
            "bytes": self.bytes,
            "role": self.role,
            "count": self.count,
            "complete": self.complete,
            "files": [{"path": f.path, "bytes": f.bytes} for f in self.files],
        }


def checked_repo(repo: str, param: str = "repo") -> str:
    """A repository id `owner/name` of safe characters (LOC-SEC-48/49), else 400."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(PART.fullmatch(p) and p not in (".", "..") for p in parts):
        raise ApiError(
            "not_a_repo", f"`{repo}` is not a repository id (owner/name) on the site.", param
        )
    return repo


def checked_path(path: str, param: str = "name") -> str:
    """A file path in a repository: safe characters, folders, no `.`/`..` (LOC-SEC-48)."""
    parts = path.split("/")
    if not path or not all(PART.fullmatch(p) and p not in (".", "..") for p in parts):
        raise ApiError(
            "invalid_parameter",
            f"`{path}` is not a file name of the repository (letters, digits, `.`, `_`, `-`, "
            "`+` and folders, no `..`).",
            param,
        )
    return path


def parse_target(text: str, endpoint: str) -> Target:
    """A repository id, or a URL on the site (or on the configured endpoint): its repository,
    and the revision and file a tree, blob or resolve link names (LOC-HFM-04/05, -13)."""
    text = text.strip()
    if "://" not in text:
        return Target(checked_repo(text))
    url = urlsplit(text)
    hosts = SITE_HOSTS | {urlsplit(endpoint).netloc}
    if url.scheme not in ("http", "https") or url.netloc not in hosts:
        raise ApiError("not_a_repo", f"`{text}` is not a URL on the site.", "repo")
    parts = [p for p in url.path.split("/") if p]
    if len(parts) < 2:
        raise ApiError("not_a_repo", f"`{text}` names no repository.", "repo")
    repo = checked_repo(f"{parts[0]}/{parts[1]}")
    if len(parts) >= 4 and parts[2] in ("tree", "blob", "resolve"):
        file = "/".join(parts[4:])
        return Target(repo, checked_revision(parts[3]), checked_path(file) if file else "")
    return Target(repo)


def checked_revision(revision: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", revision):
        raise ApiError("not_a_repo", f"`{revision}` is not a revision.", "repo")
    return revision


def quant_of(name: str) -> str:
    """The quantization a file name states (`Q4_K_M`), upper case; "" when none."""
    found = QUANT.findall(Path(name).name.removesuffix(".gguf"))
    return found[-1].upper() if found else ""


def role_by_name(path: str) -> str:
    """What a listed file is for, from its NAME (LOC-HFM-09..11)."""
    name = Path(path).name.lower()
    if "mmproj" in name:
        return "projector"
    if name.startswith(DRAFT_PREFIXES):
        return "draft"
    return "model"


def models_of(files: Sequence[RepoFile]) -> list[HubModel]:
    """The gguf files as models: a split set is one, by its first shard; what the names say
    are models first, then the companion files (LOC-HFM-02, -03, -08, -12)."""
    sets: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for file in files:
        if file.path.lower().endswith(".gguf"):
            key, index = shard(file.path)  # as the local listing groups a split set
            sets.setdefault(key, []).append((index, file))
    found = []
    for (_, total), shards in sets.items():
        ordered = tuple(f for _, f in sorted(shards, key=lambda s: s[0]))
        found.append(HubModel(ordered[0].path, ordered, total, role_by_name(ordered[0].path)))
    return sorted(found, key=lambda m: (m.role != "model", m.name))


class Hub:
    """The configured site, read with curl."""

    def __init__(self, endpoint: str, curl: str = "curl", timeout_s: float = 60.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._curl = curl
        self._timeout = timeout_s

    async def search(self, query: str, token: str | None) -> list[dict[str, Any]]:
        """Repositories with gguf files whose name matches, most downloaded first, at most
        twenty, each field asked for by name (LOC-HFS-02..08)."""
        params = [
            ("search", query),
            ("filter", "gguf"),
            ("sort", "downloads"),
            ("direction", "-1"),
            ("limit", str(SEARCH_LIMIT)),
            *(("expand[]", field) for field in EXPAND),
        ]
        found = await self._json(f"/api/models?{urlencode(params)}", token)
        if not isinstance(found, list):
            raise _bad_answer("search")
        return [
            {
                "id": str(item.get("id", "")),
                "downloads": int(item.get("downloads") or 0),
                "likes": int(item.get("likes") or 0),
                "modified": str(item.get("lastModified") or ""),
                "gated": item.get("gated") not in (None, False, "false"),
            }
            for item in found[:SEARCH_LIMIT]
            if isinstance(item, dict)
        ]

    async def files(self, target: Target, token: str | None) -> list[RepoFile]:
        """Every file of the repository at the revision (LOC-HFM-02)."""
        path = f"/api/models/{target.repo}/tree/{quote(target.revision, safe='')}"
        found = await self._json(f"{path}?recursive=true", token)
        if not isinstance(found, list):
            raise _bad_answer("listing")
        files = []
        for item in found:
            if not isinstance(item, dict) or item.get("type") != "file":
                continue
            lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
            oid = lfs.get("oid") if isinstance(lfs, dict) else None
            sha = oid if isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{64}", oid) else None
            files.append(RepoFile(str(item.get("path", "")), int(item.get("size") or 0), sha))
        return files

    async def span(
        self, target: Target, path: str, start: int, count: int, token: str | None
    ) -> bytes:
        """Bytes `start`.. (`count` of them, fewer at the file's end) of a file, by a range
        request (LOC-HFI-02). A line that fails (curl.LINE_FAILED: the site dropped it, a
        timeout) is tried again, as a download's is, after SPAN_WAITS; 502 when they cannot be
        fetched (LOC-HFI-28)."""
        revision = quote(target.revision, safe="")
        url = f"{self.endpoint}/{target.repo}/resolve/{revision}/{quote(path)}"
        options = ["--fail", "--range", f"{start}-{start + count - 1}"]
        failed = f"The header of {path} could not be fetched", "name"
        for wait in (*SPAN_WAITS, None):
            try:
                return (await self._fetch(url, options, token, failed))[:count]
            except LineFailed:
                if wait is None:
                    raise
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _json(self, path: str, token: str | None) -> Any:
        """GET `path` on the endpoint with curl; the body as JSON, or the refusal."""
        options = ["--write-out", "\n%{http_code}"]
        failed = "The site could not be reached", None
        out = await self._fetch(f"{self.endpoint}{path}", options, token, failed)
        body, _, code = out.rpartition(b"\n")
        status = int(code or b"0")
        if status == 401:
            raise ApiError(
                "not_found",
                "The site answered 401: the repository does not exist, or it needs a token.",
                "repo",
            )
        if status >= 400:
            raise ApiError("not_found", f"The site answered {status}.", "repo")
        try:
            return json.loads(body)
        except ValueError:
            raise _bad_answer("answer") from None

    async def _fetch(
        self, url: str, options: list[str], token: str | None, failed: tuple[str, str | None]
    ) -> bytes:
        """curl's output for `url` on the endpoint; 502 upstream_error (`failed`: the message's
        start and the param) when curl fails."""
        with _header_file(token) as header:
            argv = [
                *curl.argv(self._curl, self.endpoint),
                "--max-time",
                str(self._timeout),
                *options,
                *(["--header", f"@{header}"] if header is not None else []),
                url,
            ]
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await process.communicate()
        if process.returncode != 0:
            said = err.decode("utf-8", "replace").strip() or f"curl exit {process.returncode}"
            message, param = failed
            kind = LineFailed if process.returncode in curl.LINE_FAILED else ApiError
            raise kind("upstream_error", f"{message}: {said}", param)
        return out


class LineFailed(ApiError):
    """The site could not be fetched because the line failed (curl.LINE_FAILED): worth
    another try."""


def _bad_answer(what: str) -> ApiError:
    return ApiError("upstream_error", f"The site's {what} is not the JSON it should be.", None)


@contextlib.contextmanager
def _header_file(token: str | None) -> Iterator[str | None]:
    """The token as an `Authorization` header in a file only this process reads (mode 0600),
    removed when the request ends (LOC-SEC-53, -55); None without a token."""
    if not token:
        yield None
        return
    if any(c in token for c in "\r\n"):
        raise ApiError("invalid_parameter", "The token holds a line break.", "token")
    handle, path = tempfile.mkstemp(prefix="miserver-hf-", suffix=".header")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(f"Authorization: Bearer {token}\n")
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
