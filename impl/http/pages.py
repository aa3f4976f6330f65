"""The web UI's files, served from the server's own origin (REQ-003 GEN-02, SEC-40).

`/` is the page (`index.html`) and `/ui/NAME` each other file of the
`miserver.web` package folder (impl/web/) whose suffix is in `MEDIA`: the
page's ES modules and its stylesheet. The files are read once, when the app is
made, and a path must name one of them exactly, so nothing outside the folder
(and nothing else in it) can be reached. They sit inside the security
middleware, so they get the same Host check and Content-Security-Policy as the
API, and need no key: the page itself asks for one when the API answers 401
(SEC-09).
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from starlette.types import ASGIApp, Receive, Scope, Send

MEDIA = {  # suffix -> media type; a file with any other suffix is not served
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
PAGE = "index.html"


def web_files() -> dict[str, tuple[bytes, str]]:
    """Each URL path of the UI -> (the file's bytes, its media type)."""
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("miserver.web").iterdir():
        media = MEDIA.get(PurePosixPath(entry.name).suffix)
        if media is not None and entry.is_file() and not entry.name.startswith("."):
            files[f"/ui/{entry.name}"] = (entry.read_bytes(), media)
    files["/"] = files.pop(f"/ui/{PAGE}")
    return files


class Pages:
    """GET and HEAD of the UI's files; every other request goes on to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._files = web_files()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._files.get(scope["path"]) if scope["type"] == "http" else None
        if found is None or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        body, media = found
        headers = [
            (b"content-type", media.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )
