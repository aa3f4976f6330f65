"""A fake Hugging Face site on loopback, shaped like the real one, misbehaving on demand.

`Hub` holds repositories (`repo -> {path: bytes}`) and serves what the
server's downloads use: `GET|HEAD /<repo>/resolve/<revision>/<path>` with
`Range` (206 and `Content-Range`), `ETag` and `Accept-Ranges`, as the site does
for a file. Faults, set per file by the test:

    drop_after   close the connection after this many bytes of the body, for
                 the next `drops` requests (the line failing mid-file)
    status       answer this status instead (401, 404, 500)
    stall        hold the body after this many bytes until `release` is set
    rate         send the body at about this many bytes a second

Every request is recorded (method, path, Range, Authorization) in `requests`.
It also answers the site's API as `huggingface_hub` reads it: `GET /api/models`
(search: `search`, `filter`, `sort`, `limit`, and only the fields asked for
with `expand[]`, or `expand` as huggingface_hub sends it) and
`GET /api/models/<repo>/tree/<revision>` (`recursive`; files with their `lfs`
object). A repository that does not exist, or is gated (`gated`:
repo -> the token it needs) without that bearer token, answers 401 as the
site does.

`serve_hub(hub)` runs it with uvicorn and yields its base URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tools.uvicorn_thread import uvicorn_serving

CHUNK = 64 * 1024


@dataclass(slots=True)
class Fault:
    drop_after: int | None = None
    drops: int = 0
    status: int | None = None
    stall: int | None = None
    rate: int | None = None


@dataclass(slots=True)
class Hub:
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    meta: dict[str, dict[str, object]] = field(default_factory=dict)  # downloads, likes, ...
    gated: dict[str, str] = field(default_factory=dict)  # repo -> the token it needs
    faults: dict[str, Fault] = field(default_factory=dict)  # by file path
    requests: list[dict[str, str | None]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def add(self, repo: str, path: str, data: bytes) -> str:
        """Put a file in a repository; its SHA-256."""
        self.repos.setdefault(repo, {})[path] = data
        return hashlib.sha256(data).hexdigest()


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a `bytes=N-` or `bytes=N-M` header."""
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header.removeprefix("bytes=").partition("-")
    start = int(first)
    end = int(last) if last else size - 1
    return start, min(end, size - 1)


def hub_app(hub: Hub) -> Starlette:
    async def resolve(request: Request) -> Response:
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        path = request.path_params["path"]
        hub.requests.append(
            {
                "method": request.method,
                "repo": repo,
                "revision": request.path_params["revision"],
                "path": path,
                "range": request.headers.get("range"),
                "authorization": request.headers.get("authorization"),
            }
        )
        data = hub.repos.get(repo, {}).get(path)
        fault = hub.faults.get(path, Fault())
        if fault.status is not None:
            return Response(f"status {fault.status}", status_code=fault.status)
        if data is None:
            return Response("Entry not found", status_code=404)
        etag = f'"{hashlib.sha256(data).hexdigest()}"'
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        span = _range(request.headers.get("range"), len(data))
        status = 200
        start, end = 0, len(data) - 1
        if span is not None:
            start, end = span
            if start >= len(data):
                headers["Content-Range"] = f"bytes */{len(data)}"
                return Response(status_code=416, headers=headers)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start : end + 1]
        headers["Content-Length"] = str(len(body))
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        drop = None
        if fault.drop_after is not None and fault.drops > 0:
            fault.drops -= 1
            drop = fault.drop_after

        async def stream() -> AsyncIterator[bytes]:
            sent = 0
            while sent < len(body):
                if drop is not None and sent >= drop:
                    raise ConnectionResetError("the fake hub drops the line")
                if fault.stall is not None and sent >= fault.stall and not hub.release.is_set():
                    await asyncio.sleep(0.05)
                    continue
                limit = len(body) if drop is None else min(len(body), drop)
                piece = body[sent : min(sent + CHUNK, limit)]
                sent += len(piece)
                yield piece
                if fault.rate is not None:
                    await asyncio.sleep(len(piece) / fault.rate)

        return StreamingResponse(stream(), status_code=status, headers=headers)

    def record(request: Request, repo: str = "", path: str = "") -> None:
        hub.requests.append(
            {
                "method": request.method,
                "repo": repo,
                "revision": request.path_params.get("revision"),
                "path": path or request.url.path,
                "query": request.url.query,
                "range": request.headers.get("range"),
                "authorization": request.headers.get("authorization"),
            }
        )

    def refused(repo: str, request: Request) -> Response | None:
        """The site's 401 for a repository that does not exist or needs a token."""
        needed = hub.gated.get(repo)
        known = repo in hub.repos
        if not known or (needed and request.headers.get("authorization") != f"Bearer {needed}"):
            return JSONResponse({"error": "Invalid username or password."}, status_code=401)
        return None

    async def search(request: Request) -> Response:
        """GET /api/models?search=&filter=gguf&sort=downloads&limit=&expand[]=..."""
        record(request)
        query = request.query_params.get("search", "").lower()
        limit = int(request.query_params.get("limit", "1000"))
        expand = request.query_params.getlist("expand[]") + request.query_params.getlist("expand")
        found = []
        for repo, files in hub.repos.items():
            if query not in repo.lower() or not any(p.endswith(".gguf") for p in files):
                continue
            meta = hub.meta.get(repo, {})
            item: dict[str, object] = {"_id": hashlib.sha1(repo.encode()).hexdigest()[:24]}
            item["id"] = repo
            full = {
                "downloads": meta.get("downloads", 0),
                "likes": meta.get("likes", 0),
                "lastModified": meta.get("lastModified", "2024-11-01T10:00:00.000Z"),
                "gated": meta.get("gated", False),
            }
            item |= {k: v for k, v in full.items() if k in expand}  # only what was asked
            found.append(item)
        found.sort(key=lambda i: -int(hub.meta.get(str(i["id"]), {}).get("downloads", 0)))
        return JSONResponse(found[:limit])

    async def tree(request: Request) -> Response:
        """GET /api/models/<repo>/tree/<revision>?recursive=true: every file, LFS ids."""
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        record(request, repo)
        refusal = refused(repo, request)
        if refusal is not None:
            return refusal
        recursive = request.query_params.get("recursive", "false").lower() == "true"
        items: list[dict[str, object]] = []
        folders: set[str] = set()
        for path, data in sorted(hub.repos[repo].items()):
            if "/" in path and not recursive:
                folders.add(path.split("/")[0])
                continue
            oid = hashlib.sha256(data).hexdigest()
            items.append(
                {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data),
                    "path": path,
                    "lfs": {"oid": oid, "size": len(data), "pointerSize": 134},
                }
            )
        items += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in folders]
        return JSONResponse(items)

    route = "/{owner}/{name}/resolve/{revision}/{path:path}"
    return Starlette(
        routes=[
            Route("/api/models", search),
            Route("/api/models/{owner}/{name}/tree/{revision}", tree),
            Route(route, resolve, methods=["GET", "HEAD"]),
        ]
    )


@contextlib.contextmanager
def serve_hub(hub: Hub) -> Iterator[str]:
    with uvicorn_serving(hub_app(hub)) as port:
        yield f"http://127.0.0.1:{port}"
