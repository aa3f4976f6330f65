"""The request's context: its id (the current one, a fresh one) and the log filter that writes it.

A client's `X-Request-Id` is echoed when it is a sane token (1 to 128 of
`A-Z a-z 0-9 . _ : -`, sent once); anything else, or none, gets a fresh
`req_<32 hex>` (nothing else a client sends is echoed: no header injection).
While the request runs the id is `current()`: `RequestIdFilter` writes it on
log records (`record.request_id`, `-` outside a request), and the `token` and
`done` events of /api/events carry it (serving/telemetry.py). The middleware
that picks it and sets the response header is http/request_id.py.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

HEADER = "x-request-id"
NONE = "-"  # a log record's id outside any request

_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_current: ContextVar[str | None] = ContextVar("miserver_request_id", default=None)


def current() -> str | None:
    """The id of the request this code runs for, None outside one."""
    return _current.get()


@contextmanager
def bound(rid: str) -> Iterator[None]:
    """`rid` is `current()` while the block runs (in this task and the tasks it starts)."""
    token = _current.set(rid)
    try:
        yield
    finally:
        _current.reset(token)


def fresh() -> str:
    """A new id, in the shape OpenAI's are (`req_` and 32 hex digits)."""
    return "req_" + secrets.token_hex(16)


def chosen(sent: list[str]) -> str:
    """The client's id when it sent exactly one sane token, else a fresh one."""
    if len(sent) == 1 and _SANE.fullmatch(sent[0]):
        return sent[0]
    return fresh()


class RequestIdFilter(logging.Filter):
    """Writes the current request's id on every record a handler passes (`-` when none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current() or NONE
        return True
