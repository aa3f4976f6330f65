"""The web UI in a real browser: Debian's chromium driven by Playwright (issue 22).

A keyed `miserver serve` on loopback serves the page; the browser loads it,
is asked for the key, and chats. Model output for the hostile corpus comes
through a fake reply (Playwright answers the page's chat request with a
stream of the case's text), so every case reaches the page's own renderer
as a model's would, and the rendered DOM is checked for each of SEC-28..35.
Every request the page makes is logged, and the console is read for
Content-Security-Policy violations.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tests.conftest import SAE_ID
from tests.e2e.conftest import LiveServer, live_server
from tests.e2e.documents import CIRCUIT, CLUSTER
from tests.e2e.hostile_output import CASES
from tests.models import write_gguf
from tools.fakehub import Fault, Hub, serve_hub

KEY = "ui-test-key-0123456789"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WEB = Path(__file__).resolve().parents[2] / "impl" / "web"
MODULES = sorted(p.name for p in WEB.glob("*.js"))  # main.js and the modules it imports

# what a rendered reply may never hold (SEC-28..34)
DOM_CHECK = """(turn) => {
  const found = [];
  const banned = ["script", "style", "form", "input", "button", "textarea", "select", "option",
    "iframe", "object", "embed", "video", "audio", "picture", "source", "svg", "math", "link",
    "meta", "base", "frame", "frameset", "template", "noscript", "canvas", "track"];
  for (const node of turn.querySelectorAll("*")) {
    const tag = node.localName;
    if (banned.includes(tag)) found.push("element " + tag);
    for (const attr of node.attributes) {
      const name = attr.name.toLowerCase();
      if (name.startsWith("on")) found.push("handler " + name);
      if (["style", "srcset", "poster", "background", "formaction", "action"].includes(name))
        found.push("attribute " + name);
      if (/^\\s*(javascript|vbscript|data:text)/i.test(attr.value) && name !== "alt")
        found.push("url " + name + "=" + attr.value.slice(0, 40));
    }
    if (tag === "a") {
      const href = node.getAttribute("href") || "";
      if (!/^(https?:|mailto:)/i.test(href)) found.push("link " + href.slice(0, 40));
      if (node.getAttribute("target") !== "_blank") found.push("link without _blank");
      const rel = (node.getAttribute("rel") || "").split(/\\s+/);
      if (!rel.includes("noopener") || !rel.includes("noreferrer")) found.push("link rel " + rel);
    }
    if (tag === "img") {
      const src = node.getAttribute("src") || "";
      if (!/^data:image\\/(png|gif|jpeg|webp);/i.test(src)) found.push("img " + src.slice(0, 40));
    }
  }
  return found;
}"""


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The default start (the embedded GGUF on llama.cpp) with an API key."""
    with live_server(tmp_path_factory.mktemp("e2e-ui"), model=None, key=KEY) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: tools/check installs Debian's chromium package")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


class Page:
    """One browser page on the UI, with the requests it made and its console."""

    def __init__(self, browser: Any, server: LiveServer) -> None:
        self.origin = server.base_url.removesuffix("/v1")
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.requests: list[Any] = []
        self.console: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("console", lambda message: self.console.append(message.text))
        self.page.on("pageerror", lambda error: self.console.append(f"pageerror: {error}"))

    def open_with_key(self) -> None:
        """Load the page; the API answers 401, the page asks for the key and retries."""
        self.page.goto(self.origin + "/")
        dialog = self.page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        self.page.fill("#key", KEY)
        self.page.click("#key-form button[type=submit]")
        self.page.locator("#state[data-state=ready]").wait_for(timeout=60_000)

    def send(self, text: str) -> Any:
        """Send `text`; the new assistant turn once its reply has ended."""
        count = self.page.locator("article.turn.assistant").count()
        self.page.fill("#prompt", text)
        self.page.click("#send")
        turn = self.page.locator("article.turn.assistant").nth(count)
        turn.wait_for()
        self.page.locator("#send:enabled").wait_for(timeout=120_000)
        return turn

    def csp_violations(self) -> list[str]:
        return [line for line in self.console if "Content Security Policy" in line]

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser: Any, ui_server: LiveServer) -> Iterator[Page]:
    opened = Page(browser, ui_server)
    yield opened
    opened.close()


def test_a_streamed_chat_with_the_key(page: Page) -> None:
    """LOC-GEN-02, LOC-GEN-03, LOC-SEC-09, LOC-SEC-10, LOC-SEC-11, LOC-SEC-40: the page,
    its one script and one stylesheet come from the server's own origin; a 401 makes it ask
    for the key, which it keeps in the browser and sends on every API request, the
    /api/events stream included; a streamed chat fills the reply, the token rate comes
    from the `done` event; no request leaves the origin and no CSP violation is logged."""
    page.open_with_key()
    turn = page.send("Say hello in five words.")
    assert turn.locator(".body").inner_text().strip()
    page.page.locator("#rate:has-text('tokens/s')").wait_for(timeout=30_000)
    page.page.locator("#cpu:has-text('CPU ')").wait_for(timeout=30_000)
    stored = page.page.evaluate("() => localStorage.getItem('miserver.key')")
    assert stored == KEY
    api = [r for r in page.requests if "/api/" in r.url or "/v1/" in r.url]
    keyed = [r for r in api if r.headers.get("authorization") == f"Bearer {KEY}"]
    unkeyed = [r for r in api if r not in keyed]  # before the key was given: each a 401
    assert all(r.response().status == 401 for r in unkeyed)
    assert {r.url for r in unkeyed} <= {r.url for r in keyed}  # each asked again, keyed
    assert any(r.url.endswith("/api/events") for r in keyed)
    assert any(r.url.endswith("/v1/chat/completions") for r in keyed)
    assert all(r.url.startswith(page.origin + "/") for r in page.requests)
    scripts = [r.url for r in page.requests if r.resource_type == "script"]
    styles = [r.url for r in page.requests if r.resource_type == "stylesheet"]
    assert scripts[0] == page.origin + "/ui/main.js"  # the page's one script, then its imports
    assert sorted(scripts) == [page.origin + "/ui/" + name for name in MODULES]
    assert styles == [page.origin + "/ui/app.css"]
    assert page.csp_violations() == []


def test_stop_and_regenerate(page: Page) -> None:
    """Chat controls: Stop ends a streaming reply (the request is aborted and the page is
    ready to send again); Regenerate replaces the last reply with a new one."""
    page.open_with_key()
    page.page.fill("#prompt", "Write a very long story about a lighthouse keeper.")
    page.page.click("#send")
    page.page.locator("article.turn.assistant .body:not(:empty)").wait_for(timeout=60_000)
    page.page.click("#stop")
    page.page.locator("#send:enabled").wait_for(timeout=10_000)
    assert page.page.locator("article.turn.assistant").count() == 1
    page.page.click("#regenerate")
    page.page.locator("#stop:enabled").wait_for(timeout=10_000)
    page.page.click("#stop")
    page.page.locator("#send:enabled").wait_for(timeout=10_000)
    assert page.page.locator("article.turn.assistant").count() == 1
    assert page.csp_violations() == []


def test_continue_extends_the_last_reply(page: Page) -> None:
    """Chat controls: Continue sends the conversation with the last reply as a trailing
    assistant message (a partial answer to continue, OAI-CONT-01) and the new text extends
    that same turn."""
    page.open_with_key()
    page.page.fill("#prompt", "Write a very long story about a lighthouse keeper.")
    page.page.click("#send")
    body = page.page.locator("article.turn.assistant .body")
    body.locator("text=/\\w+ \\w+ \\w+/").first.wait_for(timeout=60_000)
    page.page.click("#stop")
    page.page.locator("#continue:enabled").wait_for(timeout=10_000)
    before = " ".join(body.inner_text().split())
    with page.page.expect_request("**/v1/chat/completions") as asked:
        page.page.click("#continue")
    sent = json.loads(asked.value.post_data or "{}")["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant"] and sent[-1]["content"].strip()
    page.page.locator("#send:enabled").wait_for(timeout=120_000)
    after = " ".join(body.inner_text().split())
    assert page.page.locator("article.turn.assistant").count() == 1
    assert len(after) > len(before) and after.startswith(before[: len(before) // 2])
    assert page.csp_violations() == []


def test_enter_sends_and_shift_enter_starts_a_new_line(page: Page) -> None:
    """Issue 41: in the message box Enter sends, Shift+Enter starts a new line, and an
    Enter that ends an input method's composition (`isComposing`) only ends it."""
    page.open_with_key()
    page.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_fake_reply("Yes.")
        ),
    )
    box = page.page.locator("#prompt")
    box.press_sequentially("first line")
    box.press("Shift+Enter")
    box.press_sequentially("second line")
    assert box.input_value() == "first line\nsecond line"
    box.dispatch_event("keydown", {"key": "Enter", "isComposing": True, "cancelable": True})
    box.dispatch_event("keydown", {"key": "Enter", "keyCode": 229, "cancelable": True})
    assert box.input_value() == "first line\nsecond line"
    assert page.page.locator("article.turn").count() == 0
    with page.page.expect_request("**/v1/chat/completions") as asked:
        box.press("Enter")
    sent = json.loads(asked.value.post_data or "{}")["messages"]
    assert sent == [{"role": "user", "content": "first line\nsecond line"}]
    page.page.locator("article.turn.assistant .body:has-text('Yes.')").wait_for(timeout=10_000)
    assert box.input_value() == ""
    assert page.page.locator("article.turn.user").inner_text() == "first line\nsecond line"
    chats = [r for r in page.requests if r.url.endswith("/v1/chat/completions")]
    assert len(chats) == 1
    assert page.csp_violations() == []


def _fake_reply(text: str) -> str:
    """A chat completion stream whose one reply is `text`, in three chunks."""
    third = max(1, len(text) // 3)
    parts = [text[:third], text[third : 2 * third], text[2 * third :]]
    chunks = [
        {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}]}
        for part in parts
    ]  # fmt: skip
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


@pytest.fixture(scope="module")
def hostile_page(browser: Any, ui_server: LiveServer) -> Iterator[Page]:
    opened = Page(browser, ui_server)
    opened.open_with_key()
    yield opened
    opened.close()


@pytest.mark.parametrize(("name", "text", "kept"), CASES, ids=[c[0] for c in CASES])
def test_hostile_output_renders_inert(hostile_page: Page, name: str, text: str, kept: str) -> None:
    """LOC-SEC-28, LOC-SEC-29, LOC-SEC-30, LOC-SEC-31, LOC-SEC-32, LOC-SEC-33, LOC-SEC-34,
    LOC-SEC-35, LOC-SECN-08: a model reply of the case's text, rendered by the page: no
    script, handler, `javascript:` URL, form control, style, media element or refused
    attribute in the DOM; links open in a new tab with no referrer; an image is kept only
    as inline PNG, GIF, JPEG or WebP bytes, any other shows its alt text; rendering makes no
    request at all; the case's words are still there, as text."""
    page = hostile_page
    page.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_fake_reply(text)
        ),
    )
    try:
        before = len(page.requests)
        turn = page.send(f"case {name}")
        made = [r.url for r in page.requests[before:]]
        assert made == [page.origin + "/v1/chat/completions"], made
        found = turn.element_handle().evaluate(DOM_CHECK)
        assert found == [], found
        if kept:
            assert kept in turn.locator(".body").inner_text()
    finally:
        page.page.unroute("**/v1/chat/completions")
    assert page.csp_violations() == []


@pytest.mark.timeout(60, func_only=True)  # a frozen page made Playwright wait for good
@pytest.mark.parametrize("separator", ["\u2028", "\u2029"], ids=["u2028", "u2029"])
def test_a_list_line_holding_a_line_separator_renders(hostile_page: Page, separator: str) -> None:
    """Issue 41: a list marker line holding U+2028 or U+2029 (which a regular expression's
    `.` does not match) is read as a paragraph, where the one-script renderer looped for
    good and froze the page; the words are still there."""
    page = hostile_page
    text = f"- one{separator}two\n- three"
    page.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_fake_reply(text)
        ),
    )
    try:
        turn = page.send(f"separator {separator!r}")
        shown = turn.locator(".body").inner_text()
        assert "one" in shown and "two" in shown and "three" in shown
    finally:
        page.page.unroute("**/v1/chat/completions")
    assert page.csp_violations() == []


def test_the_corpus_is_large_enough() -> None:
    """Issue 22: at least 40 hostile cases (script tags, handlers, `javascript:` links,
    forms, styles, SVG tricks, remote images, `data:` images allowed and refused, nested
    Markdown and HTML)."""
    assert len(CASES) >= 40
    assert len({name for name, _, _ in CASES}) == len(CASES)


def test_the_page_s_files_are_the_packaged_ones() -> None:
    """LOC-SEC-40: one page, one script (main.js, an ES module that imports the others),
    one stylesheet; the page has no inline script or style (every script and style is a
    file of the origin)."""
    html = (WEB / "index.html").read_text()
    assert html.count("<script") == 1 and '<script type="module" src="/ui/main.js">' in html
    assert "<style" not in html and " style=" not in html
    assert re.search(r"\son[a-z]+\s*=", html) is None


def _api(server: LiveServer, method: str, path: str, **kw: Any) -> Any:
    origin = server.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {KEY}"}
    if method not in ("GET", "HEAD"):
        headers["Content-Type"] = "application/json"  # the server's JSON rule, body or not
    response = httpx.request(method, origin + path, headers=headers, timeout=60, **kw)
    response.raise_for_status()
    return response.json()


def _until(check: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_model_switch(page: Page, ui_server: LiveServer) -> None:
    """LOC-INFO-20, LOC-INFO-21, LOC-INFO-22: the model picker: choosing another model and
    Load switches the session (the state shown follows the `state` events) and back; a
    loaded model that does not stream says so, naming its engine; with no model loaded
    nothing is said about streaming; the CPU share shown divides by the engine's own
    thread count from /api/info, never a parameter."""
    page.open_with_key()
    engine = page.page.locator("#engine")
    assert engine.inner_text() == "plain llama.cpp (mmap), no expert streaming"
    page.page.click("#unload")
    page.page.locator("#state[data-state=empty]").wait_for(timeout=60_000)
    assert engine.inner_text() == ""
    page.page.click("#load")
    page.page.locator("#state[data-state=ready]").wait_for(timeout=120_000)
    first = page.page.input_value("#model")
    options = page.page.eval_on_selector_all("#model option", "(os) => os.map((o) => o.value)")
    other = next(o for o in options if o != first)
    for target in (other, first):
        page.page.select_option("#model", target)
        page.page.click("#load")
        _until(
            lambda t=target: (_api(ui_server, "GET", "/api/info").get("model") or {}).get("id") == t
        )
        page.page.locator("#state[data-state=ready]").wait_for(timeout=120_000)
        assert page.page.input_value("#model") == target
    assert page.csp_violations() == []


def test_batch_jobs_show_their_progress_and_cancel(page: Page, ui_server: LiveServer) -> None:
    """Issue 50 item 4: the Models view lists the Batch API's batches; a running batch's
    line follows its `batch_job` events (lines done out of its total) and its Cancel
    button cancels it: the line then shows it `cancelled`, as the API does."""
    model = _api(ui_server, "GET", "/v1/models")["data"][0]["id"]
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"ui-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Tell a story, {i}."}],
                    "max_tokens": 48,
                    "ignore_eos": True,
                },
            }
        )
        + "\n"
        for i in range(40)
    )
    upload = {"purpose": "batch", "filename": "ui.jsonl", "content": lines}
    file_id = _api(ui_server, "POST", "/v1/files", json=upload)["id"]
    page.open_with_key()
    page.page.click("nav.views button[data-view=models-view]")
    made = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = _api(ui_server, "POST", "/v1/batches", json=made)
    item = page.page.locator(f"#batches li[data-id={batch['id']}]")
    item.locator("progress[value]:not([value='0'])").wait_for(timeout=120_000)  # events came
    item.locator("button.cancel-batch").click()
    page.page.locator(f"#batches li[data-id={batch['id']}][data-status=cancelled]").wait_for(
        timeout=120_000
    )
    assert _api(ui_server, "GET", f"/v1/batches/{batch['id']}")["status"] == "cancelled"
    assert page.csp_violations() == []


def test_a_settings_change(page: Page, ui_server: LiveServer) -> None:
    """LOC-PARAMS-22, LOC-PARAMS-23: the settings form comes from /api/params and
    /api/config; a value changed in it is PUT to /api/config; `typical` is shown as the
    range and a special value's label in place of its number; a session setting says it
    applies at the next load."""
    page.open_with_key()
    page.page.click("nav.views button[data-view=settings-view]")
    field = page.page.locator("#param-temp")
    field.wait_for()
    try:
        field.fill("0.25")
        field.press("Tab")
        _until(lambda: _api(ui_server, "GET", "/api/config")["values"]["temp"] == 0.25, 10)
        parallel = page.page.locator("#note-parallel").inner_text()
        assert "typical 1–8" in parallel and "next load" in parallel
        config = _api(ui_server, "GET", "/api/config")["values"]
        if config["parallel"] == 1:
            assert "serial" in parallel
    finally:
        _api(ui_server, "PUT", "/api/config", json={"reset": ["temp"]})
    assert page.csp_violations() == []


def test_the_plan_is_applied_in_one_click(page: Page, ui_server: LiveServer) -> None:
    """LOC-PLAN-24, LOC-PLAN-23, LOC-EVENTS-25: the plan in the settings view: measured on a
    click (the `plan_progress` label shown while it measures), its
    sentences shown as the server words them (every decision by its label, value text and
    brief; its `group` code only picks a colour, as an attribute, never shown as a word),
    applied with one more click (the config's plan layer is set)."""
    page.open_with_key()
    page.page.click("nav.views button[data-view=settings-view]")
    page.page.click("#plan-make")
    progress = page.page.locator("#plan-progress")
    progress.locator("text=/./").wait_for(timeout=60_000)  # LOC-EVENTS-25: its label shown
    labels = {
        "Asking for devices beyond the host",
        "Reading the model's header",
        "Timing the engine's kernels on this model's matrices",
        "Reading the model file",
        "Reading the memory available",
        "Placing the layers",
        "Deciding the settings",
    }
    shown = progress.inner_text()
    assert shown in labels or shown == "", shown
    page.page.locator("#plan .machine").wait_for(timeout=120_000)
    plan = _api(ui_server, "GET", "/api/plan?cached=1")
    assert page.page.locator("#plan .machine").inner_text() == plan["machine"]
    items = page.page.locator("#plan li")
    assert items.count() == len(plan["decisions"])
    for item, decision in zip(items.all(), plan["decisions"], strict=True):
        assert item.get_attribute("data-group") == decision["group"]
        text = item.inner_text()
        assert text.startswith(decision["label"]) and decision["brief"] in text
    page.page.click("#plan-apply")
    _until(lambda: _api(ui_server, "GET", "/api/config")["plan"] is not None, 10)
    assert page.csp_violations() == []


REPO = "fake-org/tiny-GGUF"


@pytest.fixture(scope="module")
def hub_ui(
    tmp_path_factory: pytest.TempPathFactory, gguf_path: Path
) -> Iterator[tuple[LiveServer, Hub, Path]]:
    """A keyed server whose catalog has two entries on the loopback fake hub, each file
    held by the hub after a third of its bytes until the test releases it."""
    workdir = tmp_path_factory.mktemp("e2e-ui-hub")
    data = gguf_path.read_bytes()
    hub = Hub()
    entries = []
    for name in ("tiny", "spare"):
        digest = hub.add(REPO, f"{name}.gguf", data)
        hub.faults[f"{name}.gguf"] = Fault(stall=len(data) // 3)
        file = {"name": f"{name}.gguf", "bytes": len(data), "sha256": digest}
        entries.append(
            {"id": name, "title": name.title(), "quant": "Q4_1", "repo": REPO,
             "revision": "main", "files": [file]}
        )  # fmt: skip
    catalog = workdir / "catalog.json"
    catalog.write_text(json.dumps({"schema": "mi.catalog/v1", "models": entries}))
    models = workdir / "models"
    models.mkdir()
    write_gguf(models / "vision-mmproj.gguf", kind="mmproj")  # a projector (MODELS-27)
    with serve_hub(hub) as base:
        args = ["--catalog", str(catalog), "--hf-endpoint", base, "--models-dir", str(models)]
        with live_server(workdir, model=None, args=args, key=KEY) as running:
            yield running, hub, models


def _entry(page: Page, entry: str) -> Any:
    return page.page.locator(f"#catalog li[data-id='{entry}']")


def _wait_part(part: Path, size: int) -> int:
    _until(lambda: part.is_file() and part.stat().st_size >= size, 60)
    return part.stat().st_size


def test_a_download_is_cancelled_deleted_resumed_and_finished(
    browser: Any, hub_ui: tuple[LiveServer, Hub, Path]
) -> None:
    """LOC-MODELS-38, LOC-MODELS-39: in the models view a catalog entry downloads from the
    fake hub with its progress; cancelled, a partial entry offers **Resume (X of Y GB)** in
    decimal GB and **Delete partial download**; deleting removes the `.part`; resuming asks
    the site for the rest only and ends on disk."""
    server, hub, models = hub_ui
    page = Page(browser, server)
    try:
        page.open_with_key()
        page.page.click("nav.views button[data-view=models-view]")
        size = len(hub.repos[REPO]["tiny.gguf"])
        for name in ("spare", "tiny"):
            _entry(page, name).locator("button.download").click()
            _entry(page, name).locator("progress").wait_for(timeout=30_000)
            held = _wait_part(models / f"{name}.gguf.part", size // 3)
            _entry(page, name).locator("button:has-text('Cancel')").click()
            resume = _entry(page, name).locator("button.resume")
            resume.wait_for(timeout=30_000)
            x, y = f"{held / 1e9:.2f}", f"{size / 1e9:.2f}"
            assert resume.inner_text() == f"Resume ({x} of {y} GB)"
            assert _entry(page, name).locator("button.delete-partial").inner_text() == (
                "Delete partial download"
            )
        _entry(page, "spare").locator("button.delete-partial").click()
        _entry(page, "spare").locator("button.download").wait_for(timeout=10_000)
        assert not (models / "spare.gguf.part").exists()
        hub.release.set()
        _entry(page, "tiny").locator("button.resume").click()
        _entry(page, "tiny").locator("text=On disk").wait_for(timeout=120_000)
        assert hub.requests[-1]["range"] == f"bytes={held}-"
        assert (models / "tiny.gguf").stat().st_size == size
        assert page.csp_violations() == []
    finally:
        page.close()


def test_files_that_are_not_models_are_listed_apart(
    browser: Any, hub_ui: tuple[LiveServer, Hub, Path]
) -> None:
    """LOC-MODELS-27: a file whose `role` is neither `model` nor "" (here a projector, by its
    header) is listed apart from the models, as a file not loaded on its own."""
    server, _, _ = hub_ui
    page = Page(browser, server)
    try:
        page.open_with_key()
        page.page.click("nav.views button[data-view=models-view]")
        page.page.locator("#local-other li:has-text('vision-mmproj.gguf')").wait_for()
        assert "projector" in page.page.locator("#local-other").inner_text()
        assert "vision-mmproj.gguf" not in page.page.locator("#local").inner_text()
    finally:
        page.close()


def test_hugging_face_search_inspect_and_add(
    browser: Any, hub_ui: tuple[LiveServer, Hub, Path]
) -> None:
    """LOC-HFS-09, LOC-HFI-26: text that is not a repository (`not_a_repo`) is searched
    for; a repository found lists its models; inspecting one shows the server's disk and
    memory sentences as they are; adding it puts it in the catalog."""
    server, _, _ = hub_ui
    page = Page(browser, server)
    try:
        page.open_with_key()
        page.page.click("nav.views button[data-view=models-view]")
        page.page.fill("#hf-text", "tiny")
        page.page.click("#hf-form button[type=submit]")
        page.page.locator(f"#hf-repos button.repo:has-text('{REPO}')").click()
        with page.page.expect_response("**/api/hf/inspect") as answered:
            page.page.locator("#hf-models button.inspect").first.click()
        verdict = answered.value.json()["verdict"]
        page.page.locator("#hf-inspect .disk").wait_for(timeout=30_000)
        assert page.page.locator("#hf-inspect .disk").inner_text() == verdict["disk"]
        assert page.page.locator("#hf-inspect .memory").inner_text() == verdict["memory"]
        assert "MiB" in verdict["disk"]
        page.page.click("#hf-inspect button.add")
        page.page.locator("#catalog li[data-id^='hf:']").first.wait_for(timeout=10_000)
        assert any(e["added"] for e in _api(server, "GET", "/api/models")["catalog"])
        assert page.csp_violations() == []
    finally:
        page.close()


@pytest.fixture(scope="module")
def steer_ui(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[LiveServer]:
    """SmolLM2 on transformers with the trained SAEs in its saes directory, keyed."""
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    args = ["--default-max-tokens", "24"]  # short replies: the test reads their statements
    with live_server(tmp_path_factory.mktemp("e2e-ui-steer"), env, args=args, key=KEY) as running:
        yield running


def _steering_of(turn: Any) -> str:
    meta = turn.locator(".meta .steering")
    meta.wait_for(timeout=30_000)
    return str(meta.inner_text()).removeprefix("Steering: ")


def test_a_slider_steers_the_next_reply_and_its_statement_says_so(
    browser: Any, steer_ui: LiveServer
) -> None:
    """Issue 22 (steering): an SAE attached from the steering view, a feature added and its
    strength set with a slider; the next reply's steering statement (the stream's
    `millm_steering`, the X-miLLM-Steering value) changes from `none` to the live set, and
    is the one the steering view shows for a request without steering fields."""
    page = Page(browser, steer_ui)
    try:
        page.open_with_key()
        before = _steering_of(page.send("Tell me about your favourite place."))
        assert before == "none"
        page.page.click("nav.views button[data-view=steering-view]")
        page.page.locator(f"#saes button.attach[data-sae='{SAE_ID}']").click()
        fieldset = page.page.locator(f"#attachments fieldset[data-sae='{SAE_ID}']")
        fieldset.locator("input.feature-index").fill("3")
        fieldset.locator("button.add-feature").click()
        slider = page.page.locator(f"#attachments fieldset[data-sae='{SAE_ID}'] input.strength")
        slider.wait_for(timeout=10_000)
        slider.fill("8")
        _until(lambda: _api(steer_ui, "GET", "/api/steering")["steering"] != "none", 10)
        live = _api(steer_ui, "GET", "/api/steering")
        assert live["attachments"][0]["features"] == [{"index": 3, "strength": 8.0}]
        page.page.locator(f"#steering-now:has-text('{live['steering'][:12]}')").wait_for()
        page.page.click("nav.views button[data-view=chat-view]")
        after = _steering_of(page.send("Tell me about your favourite place."))
        assert after != before and after == live["steering"]
        assert page.csp_violations() == []
    finally:
        page.close()
        with contextlib.suppress(httpx.HTTPError):
            _api(steer_ui, "DELETE", f"/api/steering/attachments/{SAE_ID}/12")


def test_the_activation_heatmap_colours_a_reply_s_tokens(
    browser: Any, steer_ui: LiveServer
) -> None:
    """Issue 22 (the heatmap), OAI-ACT-12: with activations asked for, the prompt's and the
    reply's tokens are drawn coloured by a chosen feature's value (one shade a level), each
    with its top features on hover, their text each token's piece (POST /api/detokenize);
    choosing another feature repaints them."""
    page = Page(browser, steer_ui)
    try:
        page.open_with_key()
        _api(steer_ui, "POST", "/api/steering/attachments", json={"sae_id": SAE_ID})
        page.page.check("#show-activations")
        turn = page.send("Name three colours.")
        tokens = turn.locator(".heatmap .token")
        tokens.first.wait_for(timeout=30_000)
        levels = tokens.evaluate_all("(ts) => ts.map((t) => Number(t.dataset.level))")
        assert max(levels) == 5 and all(0 <= v <= 5 for v in levels)
        assert "feature" in (tokens.first.get_attribute("title") or "")
        options = turn.locator(".heatmap select.feature option")
        assert options.count() >= 2
        first = tokens.evaluate_all("(ts) => ts.map((t) => t.dataset.value)")
        turn.locator(".heatmap select.feature").select_option(index=1)
        assert tokens.evaluate_all("(ts) => ts.map((t) => t.dataset.value)") != first
        prompt = "".join(turn.locator(".heatmap .token.prompt").all_text_contents())
        assert "Name three colours." in prompt  # the chat's rendering, the user's words in it
        reply = "".join(turn.locator(".heatmap .token:not(.prompt)").all_text_contents())
        letters = re.compile(r"[^A-Za-z]")  # Markdown turns list numbers into markers
        shown = letters.sub("", turn.locator(".body").inner_text())
        assert reply and letters.sub("", reply) in shown  # the reply's own tokens, in order
        assert page.csp_violations() == []
    finally:
        page.close()
        with contextlib.suppress(httpx.HTTPError):
            _api(steer_ui, "DELETE", f"/api/steering/attachments/{SAE_ID}/12")


def test_profiles_circuits_and_probes(
    browser: Any, steer_ui: LiveServer, trained_probe: Path
) -> None:
    """Issue 22 (steering and observation): profiles and clusters listed with their dial;
    a circuit activated from the page, its rung's evidence language shown as the server
    words it (OAI-RUNG-18); a probe armed from the page, and the verdicts of the next
    reply shown beside it."""
    _api(steer_ui, "POST", "/api/steering/attachments", json={"sae_id": SAE_ID})
    _api(steer_ui, "POST", "/api/circuits", json=CIRCUIT)
    _api(steer_ui, "POST", "/api/clusters", json=CLUSTER)
    _api(steer_ui, "POST", "/api/probes/import", json={"path": str(trained_probe)})
    [probe] = _api(steer_ui, "GET", "/api/probes")["data"]
    page = Page(browser, steer_ui)
    try:
        page.open_with_key()
        page.page.click("nav.views button[data-view=steering-view]")
        cluster = page.page.locator("#profiles li[data-profile='live-cluster']")
        cluster.locator("input.dial").wait_for()
        assert cluster.locator("input.dial").get_attribute("min") == "0.5"
        circuit = page.page.locator("#circuits li[data-circuit='crc_live']")
        circuit.locator("button.activate").click()
        page.page.locator("#circuit-rung:has-text('Evidence now')").wait_for(timeout=10_000)
        active = _api(steer_ui, "GET", "/api/circuits/active")
        assert [c["id"] for c in active["circuits"]] == ["crc_live"]
        assert active["steering"]["language"] in page.page.locator("#circuit-rung").inner_text()
        assert active["steering"]["language"] in circuit.inner_text()
        page.page.locator(f"#probes li[data-probe='{probe['name']}'] button.arm").click()
        page.page.locator(f"#probes li[data-probe='{probe['name']}'][data-armed=true]").wait_for()
        page.page.click("nav.views button[data-view=chat-view]")
        turn = page.send("Bonjour, comment allez-vous ?")
        verdicts = turn.locator(".verdicts li")
        verdicts.first.wait_for(timeout=30_000)
        assert probe["name"] in verdicts.first.inner_text()
        assert "crc_live" in _steering_of(turn)
        assert page.csp_violations() == []
    finally:
        page.close()
        for method, path in (
            ("DELETE", "/api/circuits/crc_live/active"),
            ("POST", f"/api/probes/{probe['name']}/disarm"),
            ("DELETE", f"/api/steering/attachments/{SAE_ID}/12"),
        ):
            with contextlib.suppress(httpx.HTTPError):
                _api(steer_ui, method, path)


@pytest.mark.parametrize(
    ("wait_ms", "shown"), [(12.4, "flash 12 ms"), (0, "")], ids=["waits", "none"]
)
def test_flash_is_shown_from_the_flash_wait_alone(page: Page, wait_ms: float, shown: str) -> None:
    """LOC-EVENTS-30: the page shows "flash" from a token event's `flash_wait_ms` alone (this
    server's are 0, so the event stream is answered here with one that waits), and
    nothing when it is 0."""
    token = {
        "request_id": "r", "step": 1, "steps": 8, "wall_ms": 20.0, "compute_ms": 18.0,
        "cpu_ms": 30.0, "rss_mib": 700.0, "mem_available_mib": 9000.0, "majflt": 0,
        "io_ms": 0, "mgmt_ms": 0, "stall_ms": 0, "flash_wait_ms": wait_ms, "read_mib": 0,
    }  # fmt: skip
    body = f"event: token\ndata: {json.dumps(token)}\n\n"
    page.page.route(
        "**/api/events",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=body
        ),
    )
    page.open_with_key()
    page.page.locator("#memory:has-text('700 MiB')").wait_for(timeout=10_000)
    assert page.page.locator("#flash").inner_text() == shown
    assert page.csp_violations() == []


ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "artifacts" / "ui"
VIEWPORTS = [(1280, 800), (390, 844)]
VIEWS = ["chat-view", "models-view", "steering-view", "settings-view"]


def test_screenshots_of_each_view_at_desktop_and_phone_sizes(
    browser: Any, steer_ui: LiveServer
) -> None:
    """Issue 22 (screenshots), LOC-SEC-40: each view at 1280x800 and 390x844, with an SAE
    attached, a feature steered and a reply with its heatmap, saved as PNGs under
    build/artifacts/ui/; at each size no view is wider than the window (nothing to scroll
    sideways), and no page reports a CSP violation."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _api(steer_ui, "POST", "/api/steering/attachments", json={"sae_id": SAE_ID})
    _api(
        steer_ui, "PUT", f"/api/steering/attachments/{SAE_ID}/12/features",
        json={"features": [{"index": 3, "strength": 4.0}]},
    )  # fmt: skip
    page = Page(browser, steer_ui)
    try:
        page.page.set_viewport_size({"width": 1280, "height": 800})
        page.open_with_key()
        page.page.check("#show-activations")
        page.send("Name three colours.").locator(".heatmap .token").first.wait_for(timeout=30_000)
        saved = []
        for width, height in VIEWPORTS:
            page.page.set_viewport_size({"width": width, "height": height})
            for view in VIEWS:
                page.page.click(f"nav.views button[data-view={view}]")
                page.page.locator(f"#{view}:not([hidden])").wait_for()
                wide = page.page.evaluate("() => document.documentElement.scrollWidth")
                assert wide <= width, f"{view} at {width}x{height} is {wide} px wide"
                path = ARTIFACTS / f"{view.removesuffix('-view')}-{width}x{height}.png"
                page.page.screenshot(path=str(path))
                saved.append(path)
        assert all(path.stat().st_size > 5_000 for path in saved)
        assert page.csp_violations() == []
    finally:
        page.close()
        with contextlib.suppress(httpx.HTTPError):
            _api(steer_ui, "DELETE", f"/api/steering/attachments/{SAE_ID}/12")
