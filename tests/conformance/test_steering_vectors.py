"""The kit's own steering-set hash and X-miLLM-Steering reader against the golden vectors.

The kit reads spec/vectors/ only here, never at run time: its hash and its
grammar are written from REQ-000, and these vectors prove them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miserver.conformance.headers import (
    RUNG_LANGUAGE,
    HeaderGrammarError,
    Member,
    parse_rung,
    parse_steering,
    parse_string_list,
)
from miserver.conformance.steering_hash import (
    applied_set,
    canonical_form,
    clamped_count,
    steering_set_hash,
)

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
HASHES: list[dict[str, Any]] = json.loads((VECTORS / "steering-set-hash.json").read_text("utf-8"))
HEADERS: list[dict[str, Any]] = json.loads((VECTORS / "steering-header.json").read_text("utf-8"))
HASH = "sha256:" + "ab" * 32
OTHER_HASH = "sha256:" + "cd" * 32
# Parameters whose "does not apply" value the serialiser leaves out.
ABSENT = {"changed": False, "composed": False, "clamped": 0, "reason": None}


def _pairs(vector: dict[str, Any]) -> list[tuple[int, float]]:
    return [(feature["index"], feature["strength"]) for feature in vector["features"]]


@pytest.mark.parametrize("vector", HASHES, ids=[v["id"] for v in HASHES])
def test_canonical_form_and_hash_match_the_vectors(vector: dict[str, Any]) -> None:
    """OAI-HASH-02..17, OAI-HASH-20: the canonical text and the sha256 of every golden vector."""
    assert canonical_form(vector["sae_id"], _pairs(vector)) == vector["canonical"]
    assert steering_set_hash(vector["sae_id"], _pairs(vector)) == vector["hash"]


def test_tv4_is_hashed_as_applied_and_counted_as_clamped() -> None:
    """OAI-HASH-05, OAI-HASH-17, OAI-GRAM-17: 500.0 is applied (and hashed) as 200.0, one clamp."""
    tv4 = next(v for v in HASHES if v["id"] == "TV-4")
    assert applied_set(_pairs(tv4)) == {3: 200.0}
    assert clamped_count(_pairs(tv4)) == 1
    assert clamped_count([(1, 200.0), (2, -200.0), (3, 0.0)]) == 0


def _expected_members(state: list[dict[str, Any]]) -> list[Member]:
    if not state:
        return [Member("none", {})]
    members = []
    for entry in state:
        params = {
            key: value
            for key, value in entry.items()
            if key != "kind" and not (key in ABSENT and value == ABSENT[key])
        }
        members.append(Member(entry["kind"], params))
    return members


def _sorted(members: list[Member]) -> list[tuple[str, list[tuple[str, Any]]]]:
    return sorted((m.kind, sorted(m.params.items())) for m in members)


@pytest.mark.parametrize("vector", HEADERS, ids=[v["id"] for v in HEADERS])
def test_every_vector_header_parses_to_its_state(vector: dict[str, Any]) -> None:
    """OAI-GRAM-01..31: each golden header is in the grammar and reads back as its state
    (names percent-decoded, intensities as floats, booleans bare)."""
    members = parse_steering(vector["header"])
    assert _sorted(members) == _sorted(_expected_members(vector["state"]))


def _inline(layer: int, sae: str = "a", extra: str = "") -> str:
    return f'inline;sae="{sae}";layer={layer};features=1;hash="{HASH}"{extra}'


BROKEN = [
    ("none;", "OAI-GRAM-01", "not RFC 8941"),
    (
        f'profile;name="%E2";source=active;intensity="1.0";sae="a";layer=1;features=1;'
        f'hash="{HASH}"',
        "OAI-GRAM-18",
        "a name that is not UTF-8",
    ),
    ('"none"', "OAI-GRAM-02", "a String, not a Token"),
    ("nothing", "OAI-GRAM-03", "an unknown kind"),
    ("none;changed=?1", "OAI-GRAM-03", "a boolean not bare"),
    (f"none, {_inline(1)}", "OAI-GRAM-03", "none beside another member"),
    ("unknown;reason=guess", "OAI-GRAM-03", "an unknown reason"),
    (f'inline;layer=1;sae="a";features=1;hash="{HASH}"', "OAI-GRAM-03", "parameters reordered"),
    (f'inline; sae="a";layer=1;features=1;hash="{HASH}"', "OAI-GRAM-03", "a space in a member"),
    (_inline(1, extra=";clamped=0"), "OAI-GRAM-03", "clamped=0 is omitted, never sent"),
    ('inline;sae="a";layer=1;features=1;hash="sha256:AB"', "OAI-GRAM-03", "a short upper hash"),
    (
        f'manual;sae="a";layer=1;features=1;hash="{HASH}";clamped=1',
        "OAI-GRAM-03",
        "manual never clamped",
    ),
    (
        f'profile;name="p";source=active;intensity=1.0;sae="a";layer=1;features=1;hash="{HASH}"',
        "OAI-GRAM-03",
        "intensity as a Decimal, not a String",
    ),
    (
        f'profile;name="%e2";source=active;intensity="1.0";sae="a";layer=1;features=1;'
        f'hash="{HASH}"',
        "OAI-GRAM-03",
        "lowercase percent-encoding",
    ),
    (f"{_inline(1)};changed, {_inline(2, 'b')}", "OAI-GRAM-23", "changed on one member only"),
    (f"{_inline(12)}, {_inline(3)}", "OAI-GRAM-25", "layers out of order"),
    (f"{_inline(3, 'b')}, {_inline(3, 'a')}", "OAI-GRAM-25", "saes out of order in a layer"),
    (
        f'{_inline(3)}, circuit;id="c";intensity="1.0"',
        "OAI-GRAM-25",
        "a circuit after an SAE item",
    ),
    (
        'circuit;id="c";intensity="1.0", circuit;id="c";intensity="2.0"',
        "OAI-GRAM-12",
        "one circuit twice",
    ),
]


@pytest.mark.parametrize(("value", "requirement", "why"), BROKEN, ids=[b[2] for b in BROKEN])
def test_values_outside_the_grammar_are_refused(value: str, requirement: str, why: str) -> None:
    """OAI-GRAM-01..05, -12, -16..20, -23, -25, -26: each broken value names the rule it breaks."""
    with pytest.raises(HeaderGrammarError) as refused:
        parse_steering(value)
    assert refused.value.requirement == requirement, why


def test_members_may_be_separated_by_any_optional_whitespace() -> None:
    """The grammar's parsers accept OWS around "," (RFC 8941 sf-list)."""
    members = parse_steering(f"{_inline(3)},{_inline(4)} ,\t{_inline(5)}")
    assert [m.get("layer") for m in members] == [3, 4, 5]


def test_ignored_fields_is_a_list_of_strings() -> None:
    """OAI-VALID-03: `X-miLLM-Ignored-Fields` locations, and a Token member refused."""
    value = '"user", "messages[2].name", "extra_messages[0][1].weight"'
    assert parse_string_list(value) == ["user", "messages[2].name", "extra_messages[0][1].weight"]
    with pytest.raises(ValueError):
        parse_string_list("user")
    with pytest.raises(ValueError):
        parse_string_list('"user",')


RUNG_VECTORS: dict[str, Any] = json.loads((VECTORS / "circuit-rung-header.json").read_text())
RUNG_VALUES = [
    (v["id"], v["header"], None) for v in RUNG_VECTORS["decisions"] if v["header"] is not None
] + [(v["id"], v["value"], (v["rung"], v["language"])) for v in RUNG_VECTORS["parses"]]


@pytest.mark.parametrize(
    ("value", "expected"), [(v, e) for _, v, e in RUNG_VALUES], ids=[i for i, _, _ in RUNG_VALUES]
)
def test_the_kit_reads_every_rung_vector(value: str, expected: tuple[int, str] | None) -> None:
    """OAI-RUNG-02, OAI-RUNG-05..08: every header value of spec/vectors/circuit-rung-header.json
    is in the kit's rung grammar, canonical or spaced, with its rung's phrase."""
    rung, language = parse_rung(value)
    assert language == RUNG_LANGUAGE[rung]
    if expected is not None:
        assert (rung, language) == expected


@pytest.mark.parametrize(
    ("value", "requirement"),
    [
        ('1;language="causally validated (edge)"', "OAI-RUNG-06"),
        ('0;language="causal"', "OAI-RUNG-05"),
        ('4;language="associated"', "OAI-RUNG-02"),
        ("2", "OAI-RUNG-02"),
        ('2;language="causally validated (edge)";x=1', "OAI-RUNG-02"),
        ('"2";language="causally validated (edge)"', "OAI-RUNG-02"),
    ],
)
def test_the_kit_refuses_a_wrong_rung_value(value: str, requirement: str) -> None:
    """OAI-RUNG-02, OAI-RUNG-04..06: a phrase that over-claims, a rung past 3, no language,
    an extra parameter or a String rung break the grammar, named by requirement."""
    with pytest.raises(HeaderGrammarError) as caught:
        parse_rung(value)
    assert caught.value.requirement == requirement
