"""JSON text with verbatim fragments, as body templates (corpus parts).

`parts(value)` writes a JSON value as a list of corpus parts (text, and the
`{"repeat": ...}` templates a `Raw` carries). Inside `value`, a `Raw` is
written as it is (NaN, `1e400`, 50,000 nested arrays, a raw UTF-8 emoji) and
a `Members` object member by member, so a name may repeat. Strings are
escaped to ASCII, which writes a lone surrogate as `\\ud800`.

`nodes`, `replaced` and `with_member` find and edit a value by its path
(`("messages", 0, "content")`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .corpus import Part

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Raw:
    """A fragment written verbatim: text, or parts with repeat templates."""

    parts: tuple[Part, ...]

    @classmethod
    def text(cls, text: str) -> Raw:
        return cls((text,))


@dataclass(frozen=True, slots=True)
class Members:
    """An object written member by member: a name may repeat, and may be a Raw."""

    pairs: tuple[tuple[str | Raw, Any], ...]


def parts(value: Any) -> list[Part]:
    """`value` as JSON text: adjacent text merged, templates kept."""
    out: list[Part] = []
    for part in _write(value):
        if isinstance(part, str) and out and isinstance(out[-1], str):
            out[-1] += part
        else:
            out.append(part)
    return out


def _write(value: Any) -> Iterator[Part]:
    if isinstance(value, Raw):
        yield from value.parts
    elif isinstance(value, Members | dict):
        pairs = value.pairs if isinstance(value, Members) else tuple(value.items())
        yield "{"
        for i, (name, item) in enumerate(pairs):
            yield ", " if i else ""
            yield from _write(name)
            yield ": "
            yield from _write(item)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _write(item)
        yield "]"
    else:
        yield json.dumps(value)  # ASCII: a lone surrogate becomes its escape


def nodes(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every value inside `value` (the root excluded), parents before children."""
    children: Sequence[tuple[str | int, Any]] = ()
    if isinstance(value, Mapping):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, item in children:
        yield (*path, key), item
        yield from nodes(item, (*path, key))


def replaced(value: Any, path: Path, new: Any) -> Any:
    """A copy of `value` with the value at `path` replaced by `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, Mapping):
        return {k: replaced(v, rest, new) if k == head else v for k, v in value.items()}
    return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def with_member(value: Any, path: Path, name: str | Raw, item: Any) -> Any:
    """A copy of `value` whose object at `path` gains the member `name: item` (first)."""
    target = at(value, path)
    return replaced(value, path, Members(((name, item), *target.items())))


def duplicated(value: Any, path: Path) -> Any:
    """A copy of `value` whose member at `path` is written twice, in a row."""
    parent, name = path[:-1], path[-1]
    pairs: list[tuple[str | Raw, Any]] = []
    for key, item in at(value, parent).items():
        pairs.append((key, item))
        if key == name:
            pairs.append((key, item))
    return replaced(value, parent, Members(tuple(pairs)))


def at(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value
