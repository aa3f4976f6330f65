"""The web UI's files (http/pages.py, impl/web/): what is served, and what the modules hold.

The ASGI app is called directly with a raw path, so a path with dot segments
reaches it as a client could send it, not as an HTTP client would normalize it.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from miserver.http.pages import MEDIA, Pages

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "impl" / "web"
MODULES = sorted(p.name for p in WEB.glob("*.js"))
PASSED = 599  # the status the app behind Pages answers with


async def _behind(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": PASSED, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _get(path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of `method path` through Pages."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": []}
    asyncio.run(Pages(_behind)(scope, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def test_every_file_of_the_folder_is_served_with_its_type() -> None:
    """LOC-GEN-02, LOC-SEC-40: `/` is index.html; each module and stylesheet of impl/web/
    is at /ui/NAME, JavaScript as text/javascript (a module script needs a JavaScript
    type), with its length and no-cache; HEAD answers the headers alone."""
    served = {"/": "index.html"} | {f"/ui/{name}": name for name in [*MODULES, "app.css"]}
    for path, name in served.items():
        status, headers, body = _get(path)
        assert status == 200 and body == (WEB / name).read_bytes()
        assert headers["content-type"] == MEDIA[Path(name).suffix]
        assert headers["content-length"] == str(len(body))
        assert headers["cache-control"] == "no-cache"
        assert _get(path, "HEAD")[2] == b""
    assert MEDIA[".js"] == "text/javascript; charset=utf-8"


@pytest.mark.parametrize(
    "path",
    [
        "/index.html",
        "/ui/index.html",  # the page has one address, /
        "/ui/__init__.py",
        "/ui/app.js",  # the one script before the modules (issue 41)
        "/ui/",
        "/ui",
        "/ui/../http/pages.py",
        "/ui/..%2fhttp%2fpages.py",
        "/ui/./main.js",
        "/ui//main.js",
        "/ui/MAIN.JS",
        "/main.js",
        "/ui/web/main.js",
    ],
)
def test_nothing_else_is_a_page(path: str) -> None:
    """LOC-SEC-40: only a packaged file's exact path is a page; any other path, one that
    climbs out of the folder included, goes on to the app (the API's 404)."""
    assert _get(path)[0] == PASSED


def test_only_get_and_head_are_pages() -> None:
    """A POST to a page's path goes on to the app."""
    assert _get("/ui/main.js", "POST")[0] == PASSED


def test_every_import_is_a_packaged_module() -> None:
    """Issue 41: the page loads main.js, and every module's imports name a module of the
    folder that setup.py packages (its `miserver.web` package data)."""
    html = (WEB / "index.html").read_text()
    assert re.findall(r'<script[^>]*src="([^"]+)"', html) == ["/ui/main.js"]
    for name in MODULES:
        for imported in re.findall(r'from\s+"([^"]+)"', (WEB / name).read_text()):
            assert imported.startswith("./") and (WEB / imported[2:]).is_file(), (name, imported)
    setup = (ROOT / "setup.py").read_text()
    assert '"miserver.web": ["*.html", "*.js", "*.css"]' in setup
    shipped = {p.suffix for p in WEB.iterdir() if p.name != "__init__.py" and p.is_file()}
    assert shipped <= set(MEDIA)


UNSAFE = re.compile(
    r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
    r"DOMParser|createContextualFragment|srcdoc"
)


@pytest.mark.parametrize("name", MODULES)
def test_no_module_parses_html(name: str) -> None:
    """LOC-SEC-28, LOC-SEC-29: no module turns a string into markup or code: the page is
    built from elements and text nodes only."""
    assert UNSAFE.findall((WEB / name).read_text()) == []
