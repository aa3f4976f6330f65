"""The strict reader's families: each case one edit of a target's base body.

    depth       arrays/objects nested past 64 levels (and at it), at the top and in fields
    duplicates  every member of every object written twice
    surrogates  a lone surrogate escape in every string and in a member name
    paired      surrogate pairs, escaped and as raw UTF-8 (fine input: never a 5xx)
    numbers     NaN, Infinity, numbers past a float, integers past int64 (and the edges)

Each pins `400`, the code and `param`: the text at fault (too deep, a name
twice) is `invalid_json` on /v1 and `invalid_request` on /api; one value at
fault (NaN, a lone surrogate, a number out of range) is `invalid_parameter`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from . import jsontext
from .edits import (
    MAX_DEPTH,
    Case,
    bad_value,
    base,
    case,
    edited,
    members,
    nested,
    numbers,
    objects,
    refused,
    slug,
    strings,
    where,
)
from .jsontext import Members, Raw
from .targets import json_targets

DEPTHS = (2000, 50_000)  # the two, past the limit
PAIRED_PER_TARGET = 6  # paired-surrogate cases reach the model: a few per target

# -- depth ---------------------------------------------------------------------------


def depth() -> Iterator[Case]:
    for kind in ("arrays", "objects", "alternating"):
        for levels in (MAX_DEPTH + 1, 100, 1000, *DEPTHS):
            levels += levels % 2 if kind == "alternating" else 0
            body = jsontext.parts(nested(levels, kind))
            yield case(f"depth-{kind}-{levels}", "depth", "every-body", body, refused("body"))
        unclosed = [{"repeat": ["[" if kind == "arrays" else '{"a": ', 2000]}]
        yield case(f"depth-{kind}-unclosed", "depth", "every-body", unclosed, refused("body"))
    at_limit = jsontext.parts(nested(MAX_DEPTH, "arrays"))
    yield case("depth-arrays-64-top", "depth", "json", at_limit, {"status": "4xx"})
    for name in json_targets():
        yield from _depth_in_fields(name)


def _depth_in_fields(name: str) -> Iterator[Case]:
    body = base(name)
    containers = [p for p, v in jsontext.nodes(body) if isinstance(v, dict | list)]
    for path in [*strings(body)[:1], *containers[:1]]:
        enclosing = len(path)  # the root and every container on the way: len(path) levels
        for kind in ("arrays", "objects"):
            past = {"past": MAX_DEPTH + 1 - enclosing, "2000": 2000, "50000": 50_000}
            for label, levels in past.items():
                parts = edited(name, path, nested(levels, kind))
                yield case(
                    f"depth-{name}-{slug(path)}-{kind}-{label}",
                    "depth",
                    [name],
                    parts,
                    refused("body"),
                )
            parts = edited(name, path, nested(MAX_DEPTH - enclosing, kind))
            yield case(
                f"depth-{name}-{slug(path)}-{kind}-at-limit",
                "depth",
                [name],
                parts,
                {"status": "not5xx"},
            )


# -- duplicate names -----------------------------------------------------------------


def duplicates() -> Iterator[Case]:
    for name in json_targets():
        body = base(name)
        for path in members(body):
            parts = jsontext.parts(jsontext.duplicated(body, path))
            yield case(
                f"duplicates-{name}-{slug(path)}", "duplicates", [name], parts, refused(where(path))
            )
        first = next(iter(body))
        other = Members(((first, "hostile-other"), *body.items()))
        yield case(
            f"duplicates-{name}-{first}-differs",
            "duplicates",
            [name],
            jsontext.parts(other),
            refused(first),
        )
        escaped = Raw.text(json.dumps(first).replace(first[0], f"\\u{ord(first[0]):04x}", 1))
        parts = jsontext.parts(Members(((escaped, body[first]), *body.items())))
        yield case(
            f"duplicates-{name}-{first}-escaped", "duplicates", [name], parts, refused(first)
        )
    for text, param in (('{"a": 1, "a": 2}', "a"), ('{"a": {"b": 1, "b": 1}}', "a.b")):
        yield case(f"duplicates-bodyless-{param}", "duplicates", "bodyless", text, refused(param))


# -- surrogates ----------------------------------------------------------------------

LONE = ("\ud800", "\udc00", "a\udbffb", "x\udfff", "\ude00\ud83d")  # the last: low, then high
PAIRED: tuple[Any, ...] = (
    "\U0001f600",  # written as the escaped pair \ud83d\ude00
    Raw.text('"\U0001f600"'),  # raw UTF-8, four bytes
    "\U0010ffff",  # the last code point, as \udbff\udfff
    Raw.text('"a\U0010ffffb"'),
    Raw.text('"\\\\ud800"'),  # an escaped backslash: the six characters \ud800, no surrogate
)


def surrogates() -> Iterator[Case]:
    for name in json_targets():
        body = base(name)
        for i, path in enumerate(strings(body)):
            for k in (i % len(LONE), (i + 2) % len(LONE)):
                label = f"{slug(path)}-lone{k}"
                text = LONE[k]
                yield case(
                    f"surrogates-{name}-{label}",
                    "surrogates",
                    [name],
                    edited(name, path, text),
                    bad_value(where(path)),
                )
        for first in strings(body)[:1]:
            upper = edited(name, first, Raw.text('"\\uD800"'))
            yield case(
                f"surrogates-{name}-upper-case",
                "surrogates",
                [name],
                upper,
                bad_value(where(first)),
            )
        for path in objects(body):
            parts = jsontext.parts(jsontext.with_member(body, path, "x\ud800", 1))
            yield case(
                f"surrogates-{name}-name-in-{slug(path)}",
                "surrogates",
                [name],
                parts,
                bad_value(where(path)),
            )
    for text, param in (('{"a": "\\ud800"}', "a"), ('{"\\udc00": 1}', "body")):
        yield case(f"surrogates-bodyless-{param}", "surrogates", "bodyless", text, bad_value(param))


def paired() -> Iterator[Case]:
    for name in json_targets():
        body = base(name)
        paths = strings(body)
        step = max(1, len(paths) // PAIRED_PER_TARGET)
        for i, path in enumerate(paths[::step][:PAIRED_PER_TARGET]):
            value = PAIRED[i % len(PAIRED)]
            yield case(
                f"paired-{name}-{slug(path)}-{i % len(PAIRED)}",
                "paired",
                [name],
                edited(name, path, value),
                {"status": "not5xx"},
            )
        parts = jsontext.parts(jsontext.with_member(body, (), "x\U0001f600", 1))
        yield case(f"paired-{name}-name", "paired", [name], parts, {"status": "not5xx"})


# -- numbers -------------------------------------------------------------------------

OUT_OF_RANGE = (
    ("nan", "NaN"),
    ("infinity", "Infinity"),
    ("minus-infinity", "-Infinity"),
    ("1e400", "1e400"),
    ("minus-1e400", "-1E+400"),
    ("int64-max-plus-1", str(2**63)),
    ("int64-min-minus-1", str(-(2**63) - 1)),
    ("uint64-max-plus-1", str(2**64)),
    ("digits-401", "1" + "0" * 400),
    ("float-digits-401", "1" + "0" * 400 + ".5"),
)
EDGES = (
    ("int64-max", str(2**63 - 1)),
    ("int64-min", str(-(2**63))),
    ("1e308", "1e308"),
    ("1e-400", "1e-400"),  # underflows to 0.0: a number, not an overflow
)


def numeric() -> Iterator[Case]:
    for name in json_targets():
        body = base(name)
        for i, path in enumerate(numbers(body)):
            for j in range(4):
                label, literal = OUT_OF_RANGE[(4 * i + j) % len(OUT_OF_RANGE)]
                yield case(
                    f"numbers-{name}-{slug(path)}-{label}",
                    "numbers",
                    [name],
                    edited(name, path, Raw.text(literal)),
                    bad_value(where(path)),
                )
            label, literal = EDGES[i % len(EDGES)]
            yield case(
                f"numbers-{name}-{slug(path)}-{label}",
                "numbers",
                [name],
                edited(name, path, Raw.text(literal)),
                {"status": "not5xx"},
            )
        for first in strings(body)[:1]:
            yield case(
                f"numbers-{name}-{slug(first)}-nan",
                "numbers",
                [name],
                edited(name, first, Raw.text("NaN")),
                bad_value(where(first)),
            )
    digits = ['{"n": 1', {"repeat": ["0", 5000]}, "}"]  # past Python's 4,300-digit limit
    yield case("numbers-digits-5001", "numbers", "every-body", digits, bad_value("n"))
    for label, literal in OUT_OF_RANGE[:4]:
        text = f'{{"a": [1, {literal}]}}'
        yield case(f"numbers-bodyless-{label}", "numbers", "bodyless", text, bad_value("a[1]"))


FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {
    "depth": depth,
    "duplicates": duplicates,
    "surrogates": surrogates,
    "paired": paired,
    "numbers": numeric,
}
