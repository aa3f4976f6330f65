"""X-miLLM-Steering: the applied steering state as an RFC 8941 List (OAI-GRAM).

Members, parameters in wire order (`?` only when it applies)::

    none      changed?
    unknown   reason?, changed?
    profile   name, source, intensity, sae, layer, features, hash, clamped?, changed?
    inline    sae, layer, features, hash, clamped?, changed?
    manual    sae, layer, features, hash, changed?
    circuit   id, intensity, composed?, changed?

`serialize` writes exactly that (spec/grammar/steering-header.abnf); `parse`
is its inverse, for tests and clients. This module depends only on the
standard library and http-sfv (for parsing), so engines may use it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from http_sfv.item import Item
from http_sfv.list import List
from http_sfv.types import Token

from .hashing import Feature, applied_set, steering_set_hash

REASONS = ("claims_unreadable", "profile_unreadable", "llamacpp_entries", "read_failed")
SOURCES = ("request", "active")
_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_INT_MAX = 999_999_999_999_999  # RFC 8941 Integer: at most 15 digits
_ENCODED_NAME = re.compile(r"(?:[\x20\x21\x23\x24\x26-\x5B\x5D-\x7E]|%[0-9A-F]{2})*")
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME_KEEP = frozenset(range(0x20, 0x7F)) - {ord("%"), ord('"'), ord("\\")}


def _check_string(what: str, text: str) -> None:
    if not isinstance(text, str) or any(not 0x20 <= ord(c) <= 0x7E for c in text):
        raise ValueError(f"{what} must be printable ASCII (an RFC 8941 String), not {text!r}")


def _check_int(what: str, value: int, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _INT_MAX:
        raise ValueError(f"{what} must be an integer in [{low}, {_INT_MAX}], not {value!r}")


def _check_intensity(value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"intensity must be a finite number, not {value!r}")


def _check_sae_item(sae: str, layer: int, features: int, hash: str, *, clamped: int) -> None:
    _check_string("sae", sae)
    _check_int("layer", layer)
    _check_int("features", features)
    _check_int("clamped", clamped)
    if not isinstance(hash, str) or not _HASH.fullmatch(hash):
        raise ValueError(f"hash must be sha256: + 64 lowercase hex digits, not {hash!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class NoneMember:
    """`none`: nothing was steered."""

    changed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Unknown:
    """`unknown`: the state could not be determined (never guessed)."""

    reason: str | None = None
    changed: bool = False

    def __post_init__(self) -> None:
        if self.reason is not None and self.reason not in REASONS:
            raise ValueError(f"reason must be one of {REASONS}, not {self.reason!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProfileMember:
    """`profile`: a named profile at intensity λ (from the request or globally active)."""

    name: str
    source: str
    intensity: float
    sae: str
    layer: int
    features: int
    hash: str
    clamped: int = 0
    changed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a str, not {self.name!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, not {self.source!r}")
        _check_intensity(self.intensity)
        _check_sae_item(self.sae, self.layer, self.features, self.hash, clamped=self.clamped)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InlineMember:
    """`inline`: the request's own `steering` set."""

    sae: str
    layer: int
    features: int
    hash: str
    clamped: int = 0
    changed: bool = False

    def __post_init__(self) -> None:
        _check_sae_item(self.sae, self.layer, self.features, self.hash, clamped=self.clamped)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ManualMember:
    """`manual`: live values set directly, claimed by no profile, circuit or request."""

    sae: str
    layer: int
    features: int
    hash: str
    changed: bool = False

    def __post_init__(self) -> None:
        _check_sae_item(self.sae, self.layer, self.features, self.hash, clamped=0)


@dataclasses.dataclass(frozen=True, slots=True)
class CircuitMember:
    """`circuit`: one member per circuit (not per layer)."""

    id: str
    intensity: float
    composed: bool = False
    changed: bool = False

    def __post_init__(self) -> None:
        _check_string("id", self.id)
        _check_intensity(self.intensity)


Member = NoneMember | Unknown | ProfileMember | InlineMember | ManualMember | CircuitMember
SaeItem = ProfileMember | InlineMember | ManualMember


def sae_fields(sae_id: str, applied: Mapping[int, float] | Iterable[Feature]) -> dict[str, Any]:
    """`sae`, `features` (non-zero count) and `hash` of an applied set, for a member."""
    pairs = list(applied.items() if isinstance(applied, Mapping) else applied)
    values = applied_set(pairs)
    return {"sae": sae_id, "features": len(values), "hash": steering_set_hash(sae_id, pairs)}


def inline_member(
    sae_id: str, layer: int, applied: Mapping[int, float], clamped: int = 0
) -> InlineMember:
    """The `inline` member for an applied set (values as the hook reads them)."""
    return InlineMember(layer=layer, clamped=clamped, **sae_fields(sae_id, applied))


def manual_member(sae_id: str, layer: int, applied: Mapping[int, float]) -> ManualMember:
    """The `manual` member for live values."""
    return ManualMember(layer=layer, **sae_fields(sae_id, applied))


def profile_member(
    name: str,
    source: str,
    intensity: float,
    sae_id: str,
    *,
    layer: int,
    applied: Mapping[int, float],
    clamped: int = 0,
) -> ProfileMember:
    """The `profile` member; `applied` holds clamp(stored × λ) per index."""
    fields = sae_fields(sae_id, applied)
    return ProfileMember(
        name=name, source=source, intensity=float(intensity), layer=layer, clamped=clamped, **fields
    )


def with_changed(members: Sequence[Member]) -> list[Member]:
    """The members flagged `changed` (all of them, as OAI-GRAM-23 requires)."""
    return [dataclasses.replace(member, changed=True) for member in members]


def ordered(members: Iterable[Member]) -> list[Member]:
    """Circuits by `id`, then SAE items by `layer`, then `sae` (OAI-GRAM-25); stable."""
    items = list(members)
    circuits = sorted((m for m in items if isinstance(m, CircuitMember)), key=lambda m: m.id)
    saes = [m for m in items if isinstance(m, ProfileMember | InlineMember | ManualMember)]
    rest = [m for m in items if isinstance(m, NoneMember | Unknown)]
    return [*rest, *circuits, *sorted(saes, key=lambda m: (m.layer, m.sae))]


def encode_name(name: str) -> str:
    """Percent-encode a profile name: bytes outside %x20-7E and `%`, `"`, `\\` as %XX."""
    return "".join(chr(b) if b in _NAME_KEEP else f"%{b:02X}" for b in name.encode("utf-8"))


def decode_name(text: str) -> str:
    """The inverse of `encode_name`; ValueError on anything `encode_name` never writes."""
    if not _ENCODED_NAME.fullmatch(text):
        raise ValueError(f"not a percent-encoded profile name: {text!r}")
    return urllib.parse.unquote(text, errors="strict")


def _string(text: str) -> str:
    # Only called on validated printable ASCII.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _params(member: Member) -> list[tuple[str, str | None]]:
    """(name, serialized value or None for a bare true Boolean), in wire order."""
    params: list[tuple[str, str | None]] = []
    if isinstance(member, Unknown) and member.reason is not None:
        params.append(("reason", member.reason))
    if isinstance(member, ProfileMember):
        params.append(("name", _string(encode_name(member.name))))
        params.append(("source", member.source))
        params.append(("intensity", _string(repr(float(member.intensity)))))
    if isinstance(member, CircuitMember):
        params.append(("id", _string(member.id)))
        params.append(("intensity", _string(repr(float(member.intensity)))))
        if member.composed:
            params.append(("composed", None))
    if isinstance(member, ProfileMember | InlineMember | ManualMember):
        params.append(("sae", _string(member.sae)))
        params.append(("layer", str(member.layer)))
        params.append(("features", str(member.features)))
        params.append(("hash", _string(member.hash)))
    if isinstance(member, ProfileMember | InlineMember) and member.clamped:
        params.append(("clamped", str(member.clamped)))
    if member.changed:
        params.append(("changed", None))
    return params


MEMBER_KINDS: dict[type[Member], str] = {
    NoneMember: "none",
    Unknown: "unknown",
    ProfileMember: "profile",
    InlineMember: "inline",
    ManualMember: "manual",
    CircuitMember: "circuit",
}


def _member(member: Member) -> str:
    parts = [MEMBER_KINDS[type(member)]]
    parts += [name if value is None else f"{name}={value}" for name, value in _params(member)]
    return ";".join(parts)


def _check_list(members: Sequence[Member]) -> None:
    if any(isinstance(m, NoneMember | Unknown) for m in members) and len(members) > 1:
        raise ValueError("`none` and `unknown` must be the only member")
    if len({m.changed for m in members}) > 1:
        raise ValueError("`changed` must be on every member or on none (use with_changed)")
    ids = [m.id for m in members if isinstance(m, CircuitMember)]
    if len(ids) != len(set(ids)):
        raise ValueError(f"one circuit member per circuit, got ids {ids}")


def serialize(members: Sequence[Member], *, changed: bool = False) -> str:
    """The exact X-miLLM-Steering value; `[]` is `none`; `changed` flags every member."""
    items: Sequence[Member] = members or [NoneMember()]
    if changed:
        items = with_changed(items)
    _check_list(items)
    return ", ".join(_member(m) for m in ordered(items))


# Parsing: the wire order of parameters per kind, and each parameter's reader.
_SAE = ("sae", "layer", "features", "hash")
ORDER: dict[str, tuple[str, ...]] = {
    "none": ("changed",),
    "unknown": ("reason", "changed"),
    "profile": ("name", "source", "intensity", *_SAE, "clamped", "changed"),
    "inline": (*_SAE, "clamped", "changed"),
    "manual": (*_SAE, "changed"),
    "circuit": ("id", "intensity", "composed", "changed"),
}
OPTIONAL = frozenset({"reason", "clamped", "changed", "composed"})
_CLASSES = {kind: cls for cls, kind in MEMBER_KINDS.items()}


def _read(name: str, value: object) -> Any:
    kinds: dict[str, type[object]] = {"layer": int, "features": int, "clamped": int}
    if name in ("changed", "composed"):
        if value is not True:
            raise ValueError(f"{name} must be a bare true Boolean")
        return True
    if name in ("source", "reason"):
        if not isinstance(value, Token):
            raise ValueError(f"{name} must be a Token, not {value!r}")
        return str(value)
    expected = kinds.get(name, str)
    if isinstance(value, bool) or type(value) is not expected:
        raise ValueError(f"{name} must be an RFC 8941 {expected.__name__}, not {value!r}")
    if name == "clamped" and value == 0:
        raise ValueError("clamped must be >= 1 (omitted when 0)")
    if name == "name":
        return decode_name(str(value))
    if name == "intensity":
        number = float(str(value))
        if repr(number) != value:
            raise ValueError(f"intensity must be Python repr(float), not {value!r}")
        return number
    return value


def _parse_member(kind: object, params: Mapping[str, object]) -> Member:
    if not isinstance(kind, Token) or str(kind) not in ORDER:
        raise ValueError(f"unknown member kind {kind!r}")
    order = ORDER[str(kind)]
    names = list(params)
    if [n for n in order if n in names] != names:
        raise ValueError(f"{kind}: parameters {names} are not in the order {list(order)}")
    missing = [n for n in order if n not in names and n not in OPTIONAL]
    if missing:
        raise ValueError(f"{kind}: missing parameters {missing}")
    fields = {name: _read(name, value) for name, value in params.items()}
    member: Member = _CLASSES[str(kind)](**fields)
    return member


def parse(value: str) -> list[Member]:
    """The members of an X-miLLM-Steering value; ValueError when it breaks the grammar."""
    parsed = List()
    try:
        parsed.parse(value.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError(f"not an RFC 8941 List: {value!r}") from exc
    if "=?" in _STRINGS.sub('""', value):
        raise ValueError("booleans are bare (`;changed`), never `=?1` or `=?0`")
    members: list[Member] = []
    for item in parsed:
        if not isinstance(item, Item):
            raise ValueError("inner lists are not members")
        members.append(_parse_member(item.value, dict(item.params)))
    if not members:
        raise ValueError("the value is never empty (`none` when unsteered)")
    _check_list(members)
    if ordered(members) != members:
        raise ValueError("members are not in order (circuits by id, then by layer and sae)")
    return members
