"""Seeded random mutations of the targets' base bodies (the fuzz bench's second half).

`mutations(count, seed)` yields `count` requests, the same ones for the same
seed: a JSON target drawn at random, its base body edited by one operator in
turn (byte flips, a cut, a value swapped for one of another type, deep nesting,
a lone surrogate, a name written twice, a number out of range, random bytes
inserted). A mutation may leave a valid body (a flipped letter in a prompt), so
the only outcome asked of each is: no 5xx.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from . import jsontext
from .corpus import Case, Expect, Request, expand, route_sets, targets
from .edits import nested
from .fields import SAMPLES
from .jsontext import Path, Raw
from .reader import LONE, OUT_OF_RANGE

Mutator = Callable[[random.Random, Any], bytes]
NESTING = (65, 100, 1000, 5000, 20_000)
KINDS = ("arrays", "objects", "alternating")


def _text(value: Any) -> bytes:
    return expand(jsontext.parts(value))


def _paths(value: Any) -> list[Path]:
    return [path for path, _ in jsontext.nodes(value)]


def byte_flip(rng: random.Random, body: Any) -> bytes:
    raw = bytearray(_text(body))
    for _ in range(rng.randint(1, 3)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw)


def truncate(rng: random.Random, body: Any) -> bytes:
    raw = _text(body)
    return raw[: rng.randrange(1, len(raw))]


def type_swap(rng: random.Random, body: Any) -> bytes:
    return _text(
        jsontext.replaced(body, rng.choice(_paths(body)), rng.choice(list(SAMPLES.values())))
    )


def deep_nesting(rng: random.Random, body: Any) -> bytes:
    deep = nested(rng.choice(NESTING), rng.choice(KINDS))
    return _text(jsontext.replaced(body, rng.choice(_paths(body)), deep))


def lone_surrogate(rng: random.Random, body: Any) -> bytes:
    strings = [p for p, v in jsontext.nodes(body) if isinstance(v, str)]
    objects = [()] + [p for p, v in jsontext.nodes(body) if isinstance(v, dict)]
    if strings and rng.random() < 0.75:
        return _text(jsontext.replaced(body, rng.choice(strings), rng.choice(LONE)))
    return _text(jsontext.with_member(body, rng.choice(objects), rng.choice(LONE), 1))


def duplicate_name(rng: random.Random, body: Any) -> bytes:
    members = [p for p in _paths(body) if isinstance(p[-1], str)]
    return _text(jsontext.duplicated(body, rng.choice(members)))


def huge_number(rng: random.Random, body: Any) -> bytes:
    literal = Raw.text(rng.choice(OUT_OF_RANGE)[1])
    return _text(jsontext.replaced(body, rng.choice(_paths(body)), literal))


def garbage(rng: random.Random, body: Any) -> bytes:
    raw = _text(body)
    at = rng.randrange(len(raw) + 1)
    return raw[:at] + rng.randbytes(rng.randint(1, 8)) + raw[at:]


OPERATORS: dict[str, Mutator] = {
    "byte-flip": byte_flip,
    "truncate": truncate,
    "type-swap": type_swap,
    "deep-nesting": deep_nesting,
    "lone-surrogate": lone_surrogate,
    "duplicate-name": duplicate_name,
    "huge-number": huge_number,
    "garbage": garbage,
}


def mutations(count: int, seed: int) -> Iterator[Request]:
    """`count` mutated requests, operators in turn, targets drawn with `seed`."""
    rng = random.Random(seed)
    known = targets()
    names = route_sets()["json"]
    operators = list(OPERATORS.items())
    for i in range(count):
        name = rng.choice(names)
        label, mutate = operators[i % len(operators)]
        body = mutate(rng, known[name].body)
        case = Case(
            id=f"mutation-{i}-{label}-{name}",
            family=f"mutation:{label}",
            routes=(name,),
            content_type="application/json",
            body=None,
            expect=Expect("not5xx"),
        )
        yield Request(case, known[name], body)
