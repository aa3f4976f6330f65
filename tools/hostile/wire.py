"""Families about the bytes and headers of a request rather than one field.

malformed     text that is not JSON: broken syntax, and every base body cut short
bytes         random bytes and JSON text in encodings other than UTF-8
content_type  wrong and missing content types (415 before any handler)
size          bodies at and past the 8 MiB cap, declared and chunked
chunked       chunked bodies that end early, and clients that hang up mid-body
paths         path segments, layers and query strings: invalid percent-encoded
              UTF-8, NUL, very long; hostile query strings on every GET route
"""

from __future__ import annotations

import base64
import codecs
import gzip
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from .edits import Case, body_text, case, refused, required
from .targets import json_targets

BODY_CAP = 8 * 1024 * 1024  # impl/http/security.py (LOC-SEC-67)
SEED = 24  # the number: the random bytes are the same on every run
# whole base bodies in 1-byte chunks: served as usual (the routes that answer fast)
ONE_BYTE_CHUNKS = ("completions", "embeddings", "load", "decide", "config-put", "profile-put")

MALFORMED: tuple[tuple[str, str], ...] = (
    ("open-brace", "{"),
    ("close-brace", "}"),
    ("open-bracket", "["),
    ("name-only", '{"model"'),
    ("name-colon", '{"model":'),
    ("trailing-comma", '{"a": 1,}'),
    ("array-trailing-comma", '{"a": [1, 2,]}'),
    ("unterminated-string", '{"a": "b'),
    ("single-quotes", "{'a': 1}"),
    ("bare-name", "{a: 1}"),
    ("number-name", "{1: 2}"),
    ("two-documents", '{"a": 1} {"b": 2}'),
    ("trailing-garbage", '{"a": 1}x'),
    ("extra-close", '{"a": 1}}'),
    ("missing-comma", '{"a": 1 "b": 2}'),
    ("missing-value", '{"a": }'),
    ("colon-in-array", '["a": 1]'),
    ("leading-zero", '{"a": 01}'),
    ("plus-sign", '{"a": +1}'),
    ("hex", '{"a": 0x10}'),
    ("bare-fraction", '{"a": .5}'),
    ("bare-dot", '{"a": 1.}'),
    ("bare-exponent", '{"a": 1e}'),
    ("block-comment", '{"a": 1 /* c */}'),
    ("line-comment", '{"a": 1} // c'),
    ("true-cut", "tru"),
    ("null-cut", "nul"),
    ("python-none", '{"a": None}'),
    ("python-true", '{"a": True}'),
    ("undefined", '{"a": undefined}'),
    ("nan-lower", '{"a": nan}'),
    ("inf-word", '{"a": inf}'),
    ("x-escape", '{"a": "\\x41"}'),
    ("short-unicode-escape", '{"a": "\\u12"}'),
    ("non-hex-escape", '{"a": "\\uZZZZ"}'),
    ("lone-backslash", '{"a": "\\"}'),
    ("control-char", '{"a": "\x01"}'),
    ("raw-newline", '{"a": "line\nbreak"}'),
    ("raw-tab", '{"a": "\t"}'),
    ("whitespace-only", " \n\t "),
    ("nul", "\x00"),
    ("nul-after", '{"a": 1}\x00'),
    ("utf8-bom", "\ufeff{}"),
    ("curly-quotes", "{\u201ca\u201d: 1}"),
    ("fullwidth-braces", "\uff5b\uff5d"),
)
INVALID_UTF8: tuple[tuple[str, bytes], ...] = (
    ("ff-in-string", b'{"a": "\xff"}'),
    ("cut-sequence", b'{"a": "\xc3"}'),
    ("overlong-slash", b'{"a": "\xc0\xaf"}'),
    ("cesu-high-surrogate", b'{"a": "\xed\xa0\x80"}'),
    ("cesu-pair", b'{"a": "\xed\xa0\xbd\xed\xb8\x80"}'),
    ("past-unicode", b'{"a": "\xf4\x90\x80\x80"}'),
    ("five-bytes", b'{"a": "\xf8\x88\x80\x80\x80"}'),
    ("lone-continuation", b'{"a": "\x80"}'),
    ("in-a-name", b'{"\xff": 1}'),
    ("latin-1", b'{"a": "caf\xe9"}'),
    ("after-document", b'{"a": 1}\xff'),
    ("utf16-le-bom", codecs.BOM_UTF16_LE + '{"a": 1}'.encode("utf-16-le")),
    ("utf16-be", '{"a": 1}'.encode("utf-16-be")),
    ("utf32", '{"a": 1}'.encode("utf-32")),
    ("gzip", gzip.compress(b'{"a": 1}', mtime=0)),
    ("nul-bytes", b"\x00" * 16),
)
CONTENT_TYPES: tuple[tuple[str, str | None], ...] = (
    ("none", None),
    ("empty", ""),
    ("text-plain", "text/plain"),
    ("text-json", "text/json"),
    ("form", "application/x-www-form-urlencoded"),
    ("multipart", "multipart/form-data; boundary=x"),
    ("latin-1-charset", "application/json; charset=latin-1"),
    ("utf-16-charset", "application/json; charset=utf-16"),
    ("two-charsets", "application/json; charset=utf-8; charset=latin-1"),
    ("other-parameter", "application/json; foo=bar"),
    ("jsonx", "application/jsonx"),
    ("ld-json", "application/ld+json"),
    ("patch-json", "application/json-patch+json"),
    ("list", "application/json, text/plain"),
    ("bare-json", "json"),
    ("any", "*/*"),
    ("latin-1-byte", "application/\u00e9json"),
)


def _b64(raw: bytes) -> list[Any]:
    return [{"b64": base64.b64encode(raw).decode("ascii")}]


# -- malformed and bytes -------------------------------------------------------------


def malformed() -> Iterator[Case]:
    for label, text in MALFORMED:
        yield case(f"malformed-{label}", "malformed", "every-body", text, refused(None))
    for name in json_targets():
        text = body_text(name)
        for share in (1, 25, 50, 75, 99):
            cut = max(1, len(text) * share // 100)
            yield case(
                f"malformed-{name}-cut-{share}", "malformed", [name], text[:cut], refused(None)
            )
        if required(name):
            yield case(f"malformed-{name}-empty", "malformed", [name], "", {"status": "4xx"})


def raw_bytes() -> Iterator[Case]:
    rng = random.Random(SEED)
    made = 0
    while made < 20:
        size = rng.choice((1, 2, 3, 5, 8, 16, 64, 256, 1024, 4096))
        raw = bytes(rng.randrange(256) for _ in range(size))
        if _is_json(raw):
            continue
        made += 1
        yield case(f"bytes-random-{made}", "bytes", "every-body", _b64(raw), refused(None))
    for label, raw in INVALID_UTF8:
        yield case(f"bytes-{label}", "bytes", "every-body", _b64(raw), refused(None))


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw.decode("utf-8"))
    except ValueError:
        return False
    return True


def content_type() -> Iterator[Case]:
    refusal = {"status": 415, "code": "unsupported_media_type", "param": "Content-Type"}
    for label, value in CONTENT_TYPES:
        yield case(
            f"content-type-{label}",
            "content_type",
            "every-body",
            "{}",
            refusal,
            content_type=value,
        )


# -- size and chunked ----------------------------------------------------------------


def _padded(size: int) -> list[Any]:
    """A JSON object of exactly `size` bytes that every JSON route refuses (wrong types)."""
    head = '{"values": 7, "model": 7, "pad": "'
    return [head, {"repeat": ["a", size - len(head) - 2]}, '"}']


def size() -> Iterator[Case]:
    too_large = {"status": 413, "code": "payload_too_large"}
    for label, declared, routes in (
        ("declared-cap-plus-1", BODY_CAP + 1, ["chat", "embeddings", "config-put", "cancel"]),
        ("declared-1e15", 10**15, ["chat", "unload"]),
    ):
        send = {"declare": declared, "stop_at": 0}
        yield case(f"size-{label}", "size", routes, "{}", too_large, send=send)
    routes = ["chat", "config-put"]
    yield case("size-at-cap", "size", routes, _padded(BODY_CAP), {"status": 400})
    chunked = {"mode": "chunked", "chunk": 1 << 20}
    yield case(
        "size-chunked-at-cap", "size", routes, _padded(BODY_CAP), {"status": 400}, send=chunked
    )
    past = {**chunked, "stop_at": BODY_CAP + 1}  # no 0-chunk: the server answers first
    yield case("size-chunked-past-cap", "size", routes, _padded(BODY_CAP + 1), too_large, send=past)


def chunked() -> Iterator[Case]:
    for name in json_targets():
        text = body_text(name)
        half = len(text) // 2
        yield from _chunked_cuts(name, [name], text)
        if name in ONE_BYTE_CHUNKS:
            yield case(
                f"chunked-{name}-one-byte-chunks",
                "chunked",
                [name],
                text,
                {"status": "not5xx"},
                send={"mode": "chunked", "chunk": 1},
            )
        if required(name):
            yield case(
                f"chunked-{name}-empty",
                "chunked",
                [name],
                text,
                {"status": "4xx"},
                send={"mode": "chunked", "stop_at": 0, "then": "end"},
            )
        yield case(
            f"chunked-{name}-declared-longer-hangup",
            "chunked",
            [name],
            text,
            {"status": "none"},
            send={"declare": len(text) + 100, "then": "hangup"},
        )
        yield case(
            f"chunked-{name}-length-hangup",
            "chunked",
            [name],
            text,
            {"status": "none"},
            send={"stop_at": half, "then": "hangup"},
        )
    yield from _chunked_cuts("bodyless", "bodyless", '{"a": 1, "b": [1, 2, 3], "c": "d"}')


def _chunked_cuts(label: str, routes: str | list[str], text: str) -> Iterator[Case]:
    half = len(text) // 2
    yield case(
        f"chunked-{label}-ends-early",
        "chunked",
        routes,
        text,
        refused(None),
        send={"mode": "chunked", "chunk": 7, "stop_at": half, "then": "end"},
    )
    mid_chunk = half // 16 * 16 + 5
    yield case(
        f"chunked-{label}-hangup-mid-chunk",
        "chunked",
        routes,
        text,
        {"status": "none"},
        send={"mode": "chunked", "chunk": 16, "stop_at": mid_chunk, "then": "hangup"},
    )
    yield case(
        f"chunked-{label}-hangup-between-chunks",
        "chunked",
        routes,
        text,
        {"status": "none"},
        send={"mode": "chunked", "chunk": 16, "stop_at": 32, "then": "hangup"},
    )


FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {
    "malformed": malformed,
    "bytes": raw_bytes,
    "content_type": content_type,
    "size": size,
    "chunked": chunked,
}
