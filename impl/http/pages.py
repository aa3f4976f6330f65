"""The web UI's three files, served from the server's own origin (REQ-003 GEN-02, SEC-40).

`/` is the page, `/ui/app.js` its one script and `/ui/app.css` its one
stylesheet (impl/web/). They sit inside the security middleware, so they get
the same Host check and Content-Security-Policy as the API, and need no key:
the page itself asks for one when the API answers 401 (SEC-09).
"""

from __future__ import annotations

from importlib import resources

from starlette.types import ASGIApp, Receive, Scope, Send

FILES = {  # path -> (file in miserver.web, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
}


class Pages:
    """GET and HEAD of the UI's files; every other request goes on to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        folder = resources.files("miserver.web")
        self._files = {
            path: ((folder / name).read_bytes(), media) for path, (name, media) in FILES.items()
        }

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
