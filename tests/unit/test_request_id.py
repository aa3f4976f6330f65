"""The x-request-id middleware (http/request_id.py), and the id rule and log filter of
request_context.py."""

from __future__ import annotations

import logging
import re

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from miserver import request_context
from miserver.http.request_id import RequestIdMiddleware
from miserver.request_context import RequestIdFilter, chosen

FRESH = re.compile(r"req_[0-9a-f]{32}")
log = logging.getLogger("miserver.tests.request_id")


@pytest.mark.parametrize(
    "sent", ["abc", "A-Z_0.9:x", "x" * 128, "0b2c2a3e-5d7f-4a7e-9b9c-1f2e3d4c5b6a"]
)
def test_a_sane_token_is_echoed(sent: str) -> None:
    """A client's id of 1-128 of [A-Za-z0-9._:-], sent once, is kept as it came."""
    assert chosen([sent]) == sent


@pytest.mark.parametrize(
    "sent",
    [[], [""], ["x" * 129], ["a b"], ["a\r\nSet-Cookie: x=1"], ["é"], ["a;b"], ["a", "b"]],
)
def test_anything_else_gets_a_fresh_id(sent: list[str]) -> None:
    """None, empty, too long, odd characters (header injection) or sent twice: a fresh id."""
    first, second = chosen(sent), chosen(sent)
    assert FRESH.fullmatch(first) and FRESH.fullmatch(second) and first != second


def app() -> RequestIdMiddleware:
    async def hello(request: Request) -> Response:
        log.warning("handling")
        return JSONResponse({"id": request_context.current()}, headers={"X-Request-Id": "forged"})

    return RequestIdMiddleware(Starlette(routes=[Route("/hello", hello)]))


def test_the_response_and_the_log_record_carry_the_id(caplog: pytest.LogCaptureFixture) -> None:
    """Echoed or fresh, the id is the response's one `x-request-id` (an app's own header is
    replaced), `current()` while the app runs, and `request_id` on the request's log records."""
    caplog.handler.addFilter(RequestIdFilter())
    with TestClient(app()) as client, caplog.at_level(logging.WARNING, log.name):
        echoed = client.get("/hello", headers={"X-Request-Id": "trace-1"})
        fresh = client.get("/hello", headers={"X-Request-Id": "bad id"})
        missing = client.get("/missing")
    assert echoed.headers.get_list("x-request-id") == ["trace-1"]
    assert echoed.json() == {"id": "trace-1"}
    assert FRESH.fullmatch(fresh.headers["x-request-id"])
    assert fresh.json() == {"id": fresh.headers["x-request-id"]}
    assert missing.status_code == 404 and FRESH.fullmatch(missing.headers["x-request-id"])
    ids = [getattr(r, "request_id", None) for r in caplog.records if r.name == log.name]
    assert ids == ["trace-1", fresh.headers["x-request-id"]]
    assert request_context.current() is None


def test_outside_a_request_a_record_says_dash() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert RequestIdFilter().filter(record) and record.request_id == "-"  # type: ignore[attr-defined]
