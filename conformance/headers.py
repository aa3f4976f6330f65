"""The X-miLLM-* response headers, read and checked.

`X-miLLM-Steering` is checked against spec/grammar/steering-header.abnf (OAI-GRAM).

`parse_steering(value)` checks, in order: the value is an RFC 8941 List
(OAI-GRAM-01, by the `http-sfv` package); it matches the ABNF, transcribed below as
regular expressions (member kinds, parameter order and types, bare booleans,
`sha256:` hashes, `repr(float)` intensities, percent-encoded names:
OAI-GRAM-02..24); `changed` is on every member or none (OAI-GRAM-23); one
member per circuit (OAI-GRAM-12); circuits first by id, then SAE items by
layer, then by sae (OAI-GRAM-25). It returns the members with their values
decoded, or raises `HeaderGrammarError` saying which rule broke.

`X-miLLM-Ignored-Fields` is an RFC 8941 List of Strings (`parse_string_list`).

`X-miLLM-Circuit-Rung` is checked against spec/grammar/circuit-rung-header.abnf
(`parse_rung`): an RFC 8941 Integer 0-3 with a `language` String that is exactly
its rung's phrase (OAI-RUNG-02, -05..08), canonical or with spaces after `;`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from http_sfv.item import Item
from http_sfv.list import List as SfList
from http_sfv.types import Token

# RFC 8941 and RFC 5234 pieces the ABNF imports.
SF_STRING = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'
OWS = r"[ \t]*"
# The ABNF's own rules.
COUNT = r"[0-9]{1,15}"
POSITIVE = r"[1-9][0-9]{0,14}"
CHANGED = r"(?:;changed)?"
COMPOSED = r"(?:;composed)?"
CLAMPED = rf"(?:;clamped={POSITIVE})?"
SOURCE = r"(?:request|active)"
REASON = r"(?:claims_unreadable|profile_unreadable|llamacpp_entries|read_failed)"
HASH = r'"sha256:[0-9a-f]{64}"'
INTENSITY = r'"-?(?:[0-9]+\.[0-9]+|[0-9]+(?:\.[0-9]+)?e[+-][0-9]{2,})"'
NAME = r'"(?:[\x20\x21\x23\x24\x26-\x5b\x5d-\x7e]|%[0-9A-F]{2})*"'
SAE_PARAMS = rf";sae={SF_STRING};layer={COUNT};features={COUNT};hash={HASH}"

NONE_MEMBER = rf"none{CHANGED}"
UNKNOWN_MEMBER = rf"unknown(?:;reason={REASON})?{CHANGED}"
PROFILE_MEMBER = (
    rf"profile;name={NAME};source={SOURCE};intensity={INTENSITY}{SAE_PARAMS}{CLAMPED}{CHANGED}"
)
INLINE_MEMBER = rf"inline{SAE_PARAMS}{CLAMPED}{CHANGED}"
MANUAL_MEMBER = rf"manual{SAE_PARAMS}{CHANGED}"
CIRCUIT_MEMBER = rf"circuit;id={SF_STRING};intensity={INTENSITY}{COMPOSED}{CHANGED}"
LIST_MEMBER = rf"(?:{CIRCUIT_MEMBER}|{PROFILE_MEMBER}|{INLINE_MEMBER}|{MANUAL_MEMBER})"
SAE_LIST = rf"{LIST_MEMBER}(?:{OWS},{OWS}{LIST_MEMBER})*"
STEERING_VALUE = re.compile(rf"{NONE_MEMBER}|{UNKNOWN_MEMBER}|{SAE_LIST}")

SAE_KINDS = ("profile", "inline", "manual")


class HeaderGrammarError(ValueError):
    """The value breaks the grammar; `requirement` names the rule."""

    def __init__(self, message: str, requirement: str) -> None:
        super().__init__(message)
        self.requirement = requirement


@dataclass(frozen=True, slots=True)
class Member:
    """One list member: its kind and its parameters, decoded (`name` percent-decoded,
    `intensity` a float, booleans True)."""

    kind: str
    params: dict[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)


def _decoded(kind: str, key: str, value: Any) -> Any:
    if key == "intensity":
        return float(value)
    if key == "name" and kind == "profile":
        try:
            return unquote_to_bytes(str(value)).decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderGrammarError(
                f"profile name {value!r} is not percent-encoded UTF-8", "OAI-GRAM-18"
            ) from None
    if isinstance(value, str):  # Token or String
        return str(value)
    return value


def _rfc8941_items(value: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, raw parameters) per member, or OAI-GRAM-01/02 errors."""
    parsed = SfList()
    try:
        parsed.parse(value.encode("latin-1"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise HeaderGrammarError(f"not an RFC 8941 List: {exc}", "OAI-GRAM-01") from None
    items: list[tuple[str, dict[str, Any]]] = []
    for item in parsed:
        if not isinstance(item, Item) or not isinstance(item.value, Token):
            raise HeaderGrammarError(f"member {item!s} is not a Token item", "OAI-GRAM-02")
        items.append((str(item.value), dict(item.params)))
    return items


def _order_key(member: Member) -> tuple[int, int, str]:
    if member.kind == "circuit":
        return (0, 0, str(member.get("id")))
    return (1, int(member.get("layer", 0)), str(member.get("sae", "")))


def _check_semantics(members: list[Member]) -> None:
    changed = {bool(member.get("changed", False)) for member in members}
    if len(changed) > 1:
        raise HeaderGrammarError("`changed` is on some members but not all", "OAI-GRAM-23")
    circuits = [member.get("id") for member in members if member.kind == "circuit"]
    if len(circuits) != len(set(circuits)):
        raise HeaderGrammarError("a circuit has more than one member", "OAI-GRAM-12")
    keys = [_order_key(member) for member in members]
    if keys != sorted(keys):
        raise HeaderGrammarError(
            "members not ordered circuits (by id), then SAE items (by layer, then sae)",
            "OAI-GRAM-25",
        )


def parse_steering(value: str) -> list[Member]:
    """The members of an `X-miLLM-Steering` value; HeaderGrammarError if it breaks the grammar."""
    items = _rfc8941_items(value)
    if not STEERING_VALUE.fullmatch(value):
        raise HeaderGrammarError(
            f"{value!r} does not match spec/grammar/steering-header.abnf "
            "(kinds, parameter order and types, bare booleans, no spaces inside a member)",
            "OAI-GRAM-03",
        )
    members = [
        Member(kind, {key: _decoded(kind, key, raw) for key, raw in params.items()})
        for kind, params in items
    ]
    _check_semantics(members)
    return members


def parse_string_list(value: str) -> list[str]:
    """An RFC 8941 List of Strings (X-miLLM-Ignored-Fields, OAI-VALID-03); else ValueError."""
    parsed = SfList()
    parsed.parse(value.encode("latin-1"))
    found: list[str] = []
    for item in parsed:
        if not isinstance(item, Item) or type(item.value) is not str:
            raise ValueError(f"member {item!s} is not a String")
        found.append(item.value)
    return found


RUNG_LANGUAGE = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}
RUNG_VALUE = re.compile(r'([0-3]); *language=("(?:[^"\\]|\\.)*")')
_RUNG_IDS = {0: "OAI-RUNG-05", 1: "OAI-RUNG-06", 2: "OAI-RUNG-07", 3: "OAI-RUNG-08"}


def parse_rung(value: str) -> tuple[int, str]:
    """(rung, language) of an `X-miLLM-Circuit-Rung` value; HeaderGrammarError otherwise."""
    item = Item()
    try:
        item.parse(value.encode("latin-1"))
    except (ValueError, UnicodeEncodeError):
        raise HeaderGrammarError(f"{value!r} is not an RFC 8941 Item", "OAI-RUNG-02") from None
    found = RUNG_VALUE.fullmatch(value)
    if found is None or type(item.value) is not int or set(item.params) != {"language"}:
        raise HeaderGrammarError(
            f"{value!r} does not match spec/grammar/circuit-rung-header.abnf "
            "(an Integer 0-3 and one `language` String)",
            "OAI-RUNG-02",
        )
    rung, language = item.value, item.params["language"]
    if language != RUNG_LANGUAGE[rung]:
        raise HeaderGrammarError(
            f"rung {rung}'s language is {RUNG_LANGUAGE[rung]!r}, not {language!r}",
            _RUNG_IDS[rung],
        )
    return rung, language
