"""The strict JSON reader every /v1 and /api body passes (impl/http/body.py, issue 24)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miserver.http.body import MAX_DEPTH, BodyRefused, read


def refusal(raw: bytes, max_depth: int = MAX_DEPTH) -> BodyRefused:
    with pytest.raises(BodyRefused) as caught:
        read(raw, max_depth)
    assert caught.value.message
    return caught.value


def nested(depth: int, kind: str = "[") -> bytes:
    if kind == "[":
        return b"[" * depth + b"1" + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(
    "raw",
    [
        nested(2000),
        nested(50_000, "{"),
        b"[" * 2000,  # unbalanced too: refused as deep, never a RecursionError
        b'{"a":[' * 33 + b"1" + b"]}" * 33,  # 66 levels, two per round of `{[`
        nested(MAX_DEPTH + 1),
    ],
    ids=["arrays-2000", "objects-50000", "unclosed-2000", "alternating-66", "one-past"],
)
def test_nesting_past_the_limit_is_refused_naming_the_body(raw: bytes) -> None:
    """Issue 24: deep nesting was a RecursionError (500); now 400 with `param: body`."""
    refused = refusal(raw)
    assert refused.param == "body" and not refused.value


def test_nesting_at_the_limit_is_read_and_the_limit_is_a_setting() -> None:
    """Issue 24: 64 levels pass; JSON_MAX_DEPTH moves the limit either way."""
    assert read(nested(MAX_DEPTH)) is not None
    assert read(nested(100), max_depth=100) is not None
    assert refusal(nested(5), max_depth=4).param == "body"


def test_brackets_inside_strings_do_not_count() -> None:
    """Only structure nests: a string of 10,000 brackets (escaped quotes in it) is text."""
    text = '[[[[{{{{\\"' * 1000
    assert read(json.dumps({"content": text}).encode()) == {"content": text}


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"max_tokens": 3, "max_tokens": 5}', "max_tokens"),
        (b'{"messages": [{"role": "user", "role": "system"}]}', "messages[0].role"),
        (b'{"a": {"b": [{"c": 1, "c": 1}]}}', "a.b[0].c"),
    ],
    ids=["top", "in-a-message", "deep-equal-values"],
)
def test_a_name_given_twice_is_refused_naming_the_member(raw: bytes, param: str) -> None:
    """Issue 24: duplicate names were accepted, the last one winning (request smuggling)."""
    refused = refusal(raw)
    assert refused.param == param and not refused.value


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
        (b'{"stop": ["ok", "x\\udfffy"]}', "stop[1]"),
        (b'{"input": ["a", "b", "\\uDC00"]}', "input[2]"),
        (b'{"a": {"\\ud800": 1}}', "a"),
        (b'"\\ud83d"', "body"),
        (b'{"s": "\\ud83d\\ud83d\\ude00"}', "s"),  # a pair after a lone high one
    ],
    ids=["chat-content", "stop-entry", "upper-case-escape", "member-name", "top", "high-high-low"],
)
def test_a_lone_surrogate_is_refused_naming_the_string(raw: bytes, param: str) -> None:
    """Issue 24: a lone surrogate reached the tokenizer and failed there (500)."""
    refused = refusal(raw)
    assert refused.param == param and refused.value


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    """A pair is one character; `\\\\ud800` is a backslash and five letters."""
    assert read(b'{"s": "\\ud83d\\ude00 \\\\ud800"}') == {"s": "\U0001f600 \\ud800"}


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"temperature": NaN}', "temperature"),
        (b'{"logit_bias": {"5": Infinity}}', "logit_bias.5"),
        (b"[1, -Infinity]", "[1]"),
        (b'{"seed": 9223372036854775808}', "seed"),
        (b'{"seed": -9223372036854775809}', "seed"),
        (b'{"prompt": [1, 2, 18446744073709551616]}', "prompt[2]"),
        (b'{"temperature": 1e400}', "temperature"),
        (b'{"top_p": -1' + b"0" * 400 + b".5}", "top_p"),
        (b'{"n": 1' + b"0" * 5000 + b"}", "n"),  # past Python's 4,300-digit limit
    ],
    ids=[
        "nan",
        "infinity-in-a-map",
        "minus-infinity",
        "int64-max-plus-one",
        "int64-min-minus-one",
        "token-id-past-uint64",
        "float-overflow",
        "float-overflow-by-digits",
        "5001-digits",
    ],
)
def test_numbers_json_or_the_engines_cannot_hold_are_refused(raw: bytes, param: str) -> None:
    """Issue 24, OAI-INL-10: NaN/Infinity are not JSON; integers end in C, where int64 is
    the most. One value is at fault: the caller answers invalid_parameter."""
    refused = refusal(raw)
    assert refused.param == param and refused.value


def test_numbers_at_the_edges_are_read() -> None:
    """Issue 24: the int64 bounds and a large finite float are values, not refusals."""
    raw = b'{"a": 9223372036854775807, "b": -9223372036854775808, "c": 1e308, "d": [0.5, 2]}'
    assert read(raw) == {"a": 2**63 - 1, "b": -(2**63), "c": 1e308, "d": [0.5, 2]}


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe{}", b'{"a": "\xc3"}', b"", b"{", b'{"a": 1,}', b"\xef\xbb\xbf{}"],
    ids=["utf16-bom", "cut-utf8", "empty", "truncated", "trailing-comma", "utf8-bom"],
)
def test_text_that_is_not_utf8_json_is_refused_with_no_param(raw: bytes) -> None:
    """LOC-GEN-14: a body that is not valid JSON (not UTF-8, cut, a trailing comma, a BOM)."""
    refused = refusal(raw)
    assert refused.param is None and not refused.value


def test_an_ordinary_request_reads_as_the_standard_library_reads_it() -> None:
    """OAI-GEN-02 (the SDKs' bodies): escaped or raw Unicode, 10,000 token ids, nulls and
    empty containers read exactly as json.loads reads them."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "héllo \U0001f600 [{"}],
        "prompt": list(range(10_000)),
        "stop": ["a", "b"],
        "temperature": 0.7,
        "tools": [{"function": {"parameters": {"type": "object", "properties": {}}}}],
        "x": None,
        "y": [True, False, None, 1, 1.5, "s", [], {}],
    }
    for ensure_ascii in (True, False):
        raw = json.dumps(body, ensure_ascii=ensure_ascii).encode()
        assert read(raw) == json.loads(raw)
