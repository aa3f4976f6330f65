"""One corpus request over loopback HTTP, and the check of what came back.

`send(client, origin, request)` sends a plain request (its body whole, the
route's own path) with httpx on a kept-alive connection, and everything else
over a raw socket, byte for byte: chunked bodies cut short, bodies that stop
and hang up, declared lengths, request targets with invalid percent-encoding,
header values outside ASCII. An event stream is read up to its first event
(`GET /api/events` never ends); any other answer whole.

`problems(request, outcome)` lists what breaks the contract: a 5xx, a status
outside the expected one, an error body not OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`) or not as
spec/policy/errors.yaml catalogues its code, a pinned `code` or `param` that
differs, an error event with a server-fault code inside a stream, and a
response without `x-request-id`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from .corpus import ROOT, Request, Send

TIMEOUT_S = 60.0
ERROR_KEYS = frozenset({"message", "type", "param", "code"})
ANTHROPIC_KEYS = frozenset({"type", "error", "request_id"})
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came back: None as `status` when nothing did (`error` says why)."""

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    seconds: float = 0.0
    error: str | None = None


@cache
def catalog() -> Mapping[str, tuple[int, str]]:
    """spec/policy/errors.yaml: code -> (status, type)."""
    raw = yaml.safe_load((ROOT / "spec" / "policy" / "errors.yaml").read_text(encoding="utf-8"))
    return {code: (int(v["status"]), str(v["type"])) for code, v in raw.items()}


@cache
def anthropic_errors() -> tuple[Mapping[int, int], Mapping[int, str]]:
    """spec/policy/anthropic_errors.yaml: the Messages routes' statuses and error types."""
    path = ROOT / "spec" / "policy" / "anthropic_errors.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    statuses = {int(k): int(v) for k, v in raw["statuses"].items()}
    return statuses, {int(k): str(v) for k, v in raw["types"].items()}


def greedy(http: httpx.Client, origin: str, model: str) -> str:
    """A greedy reply's choices and usage as the server wrote them (its id and time left
    out): compared before and after a run. Seeded, so prefilled in full: no cache kept
    from an earlier request can change it."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "temperature": 0,
        "max_tokens": 16,
        "seed": 7,
    }
    response = http.post(f"{origin}/v1/chat/completions", json=body, timeout=TIMEOUT_S)
    response.raise_for_status()
    reply = response.json()
    return json.dumps([reply["choices"], reply["usage"]], ensure_ascii=False)


# -- sending -------------------------------------------------------------------------


def send(
    client: httpx.Client, origin: str, request: Request, timeout: float = TIMEOUT_S
) -> Outcome:
    """`request` to the server at `origin` (`http://127.0.0.1:PORT`)."""
    started = time.perf_counter()
    try:
        if _plain(request):
            status, headers, body = _with_httpx(client, origin, request, timeout)
        else:
            status, headers, body = _with_socket(origin, request, timeout)
    except (OSError, httpx.HTTPError) as exc:
        return Outcome(None, seconds=time.perf_counter() - started, error=repr(exc))
    return Outcome(status, headers, body, time.perf_counter() - started)


def _plain(request: Request) -> bool:
    content_type = request.case.content_type
    printable = content_type is None or (content_type.isascii() and content_type.isprintable())
    own_target = request.case.path is None and not request.case.query
    return request.case.send.plain and own_target and printable


def _with_httpx(
    client: httpx.Client, origin: str, request: Request, timeout: float
) -> tuple[int | None, dict[str, str], bytes]:
    content_type = request.case.content_type
    headers = {"Content-Type": content_type} if content_type is not None else {}
    with client.stream(
        request.method,
        origin + request.path,
        content=request.body,
        headers=headers,
        timeout=timeout,
    ) as response:
        found = {k.lower(): v for k, v in response.headers.items()}
        if _first_event_only(request, found):
            body = b""
            for chunk in response.iter_raw():
                body += chunk
                if b"\n\n" in body:
                    break
        else:
            body = response.read()
    return response.status_code, found, body


def _first_event_only(request: Request, headers: Mapping[str, str]) -> bool:
    return request.method == "GET" and headers.get("content-type", "").startswith(EVENT_STREAM)


def _with_socket(
    origin: str, request: Request, timeout: float
) -> tuple[int | None, dict[str, str], bytes]:
    where = urlsplit(origin)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    with socket.create_connection((host, port), timeout=timeout) as sock:
        wire = _head(request, f"{host}:{port}") + _wire_body(request.body or b"", request.case.send)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(wire)  # one write: a server that answers from the head alone gets it all
        if request.case.send.then == "hangup":
            return None, {}, b""
        return _parse(_receive(sock, stop_at_event=request.method == "GET"))


def _head(request: Request, host: str) -> bytes:
    lines = [f"{request.method} {request.path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    if request.case.content_type is not None:
        lines.append(f"Content-Type: {request.case.content_type}")
    plan = request.case.send
    if plan.mode == "chunked":
        lines.append("Transfer-Encoding: chunked")
    elif request.body is not None or plan.declare is not None:
        size = plan.declare if plan.declare is not None else len(request.body or b"")
        lines.append(f"Content-Length: {size}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _wire_body(body: bytes, plan: Send) -> bytes:
    """The body bytes as sent: whole, cut at `stop_at`, or framed in chunks."""
    cut = len(body) if plan.stop_at is None else min(plan.stop_at, len(body))
    if plan.mode != "chunked":
        return body[:cut]
    out: list[bytes] = []
    for start in range(0, cut, plan.chunk):
        piece = body[start : start + plan.chunk]
        if start + plan.chunk > cut and plan.then == "hangup":
            out.append(b"%x\r\n" % len(piece) + body[start:cut])  # declared whole, sent part
            return b"".join(out)
        piece = body[start:cut] if start + plan.chunk > cut else piece
        out.append(b"%x\r\n" % len(piece) + piece + b"\r\n")
    if plan.stop_at is None or plan.then == "end":
        out.append(b"0\r\n\r\n")
    return b"".join(out)


def _receive(sock: socket.socket, *, stop_at_event: bool) -> bytes:
    """Everything until the server closes (the request said `Connection: close`), or, for
    an event stream, its first event."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if stop_at_event and EVENT_STREAM.encode() in head.lower() and b"\n\n" in rest:
            break
    return data


def _parse(data: bytes) -> tuple[int | None, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/"):
        return None, {}, b""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunked(body)
    return int(lines[0].split()[1]), headers, body


def _dechunked(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return out


# -- checking ------------------------------------------------------------------------


def problems(request: Request, outcome: Outcome) -> list[str]:
    """What in `outcome` breaks the contract for `request`, each line naming the case."""
    expect = request.case.expect
    if expect.status == "none":
        return []  # the client hung up: that the server keeps serving is checked apart
    if outcome.status is None:
        return [f"{request.label}: no answer ({outcome.error})"]
    found = _status(expect.status, outcome.status)
    if outcome.status >= 400:
        found += _error_body(request, outcome)
    elif outcome.headers.get("content-type", "").startswith(EVENT_STREAM):
        found += _stream(request, outcome.body)
    if "x-request-id" not in outcome.headers:
        found.append("no x-request-id header")
    shown = outcome.body[:160].decode("utf-8", "replace")
    return [f"{request.label}: {p} (got {outcome.status}: {shown})" for p in found]


def _status(expected: int | str, got: int) -> list[str]:
    if got >= 500:
        return [f"a server error, {got}"]
    if expected == "4xx":
        ok = 400 <= got < 500
    elif expected == "not5xx":
        ok = True
    else:
        ok = got == expected
    return [] if ok else [f"status {got}, expected {expected}"]


def _error_body(request: Request, outcome: Outcome) -> list[str]:
    try:
        body = json.loads(outcome.body)
    except ValueError:
        return ["an error body that is not JSON"]
    error = body.get("error") if isinstance(body, dict) else None
    if anthropic(request):
        if not isinstance(error, dict) or set(body) != ANTHROPIC_KEYS or set(error) != ERROR_KEYS:
            return [
                "an error body not shaped {type, error: {type, message, code, param}, request_id}"
            ]
        found = _anthropic(error, outcome.status)
    elif not isinstance(error, dict) or set(body) != {"error"} or set(error) != ERROR_KEYS:
        return ["an error body not shaped {error: {message, type, param, code}}"]
    else:
        found = _catalogued(error, outcome.status)
    expect = request.case.expect
    if request.code is not None and error["code"] != request.code:
        found.append(f"code {error['code']!r}, expected {request.code!r}")
    if expect.param_pinned and error["param"] != expect.param:
        found.append(f"param {error['param']!r}, expected {expect.param!r}")
    return found


def anthropic(request: Request) -> bool:
    """Whether the request goes to a Messages route, which answers in Anthropic's shapes."""
    return request.path.split("?")[0] in ANTHROPIC_PATHS


def _anthropic(error: Mapping[str, Any], status: int | None) -> list[str]:
    """An Anthropic-shaped error: its code catalogued, its status and type Anthropic's for
    the catalogued status (a 503 is 529 `overloaded_error`)."""
    entry = catalog().get(error["code"])
    if entry is None:
        return [f"code {error['code']!r} is not in spec/policy/errors.yaml"]
    statuses, types = anthropic_errors()
    expected = statuses.get(entry[0], entry[0])
    kind = types.get(expected, "invalid_request_error" if expected < 500 else "api_error")
    if (status, error["type"]) != (expected, kind):
        return [f"{error['code']} should be ({expected}, {kind})"]
    return []


def _catalogued(error: Mapping[str, Any], status: int | None) -> list[str]:
    if not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return ["message and type must be strings"]
    if error["param"] is not None and not isinstance(error["param"], str):
        return ["param must be a string or null"]
    entry = catalog().get(error["code"])
    if entry is None:
        return [f"code {error['code']!r} is not in spec/policy/errors.yaml"]
    if entry != (status, error["type"]):
        return [
            f"{error['code']} is catalogued as {entry}, answered as ({status}, {error['type']})"
        ]
    return []


TYPED_ENDINGS = (
    b"event: response.completed",
    b"event: response.incomplete",
    b"event: message_stop",
)
"""How a typed stream (the Responses and Messages APIs', which have no [DONE]) ends when it
did not fail."""


def _stream(request: Request, body: bytes) -> list[str]:
    """A stream's error events carry no server-fault code; a POST stream ends with [DONE],
    or a typed one (`event: response.created` first) with its completing event."""
    found = []
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: {"):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            found.append(f"an event that is not JSON: {line[:80]}")
            continue
        error = event if event.get("type") == "error" else event.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if code is not None and catalog().get(code, (500, ""))[0] >= 500:
            found.append(f"an error event with code {code!r} in the stream")
    typed = body.startswith(b"event: ")
    if request.method == "POST" and typed and not any(end in body for end in TYPED_ENDINGS):
        found.append("a typed stream that does not end with its completing event")
    elif request.method == "POST" and not typed and b"data: [DONE]" not in body:
        found.append("a stream that does not end with [DONE]")
    return found
