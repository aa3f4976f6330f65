"""X-miLLM-Steering (REQ-000 GRAM) over spec/vectors/steering-header.json, and its properties."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from importlib import resources
from typing import Any

import http_sfv
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miserver.steering import header as h
from miserver.steering import steering_set_hash

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("miserver.spec") / "vectors" / "steering-header.json").read_text("utf-8")
)
CLASSES = {kind: cls for cls, kind in h.MEMBER_KINDS.items()}
TV1_SAE = "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11"
TV3_SAE = "jbloom--gemma-2-2b-res-jb--layer_20--width_16k--average_l0_71"
TV1_HASH = "sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105"
TV4_HASH = "sha256:3f51779e6e33ee248acf6f520cb9475b4ef62f68275060bb69d2e228033b78df"


def members_of(state: list[dict[str, Any]]) -> list[h.Member]:
    return [CLASSES[m["kind"]](**{k: v for k, v in m.items() if k != "kind"}) for m in state]


def sfv(value: str) -> http_sfv.List:
    parsed = http_sfv.List()
    parsed.parse(value.encode("ascii"))
    return parsed


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_serializes_exactly(vector: dict[str, Any]) -> None:
    """OAI-GRAM-01..-31: each state serialises to exactly the stored value."""
    assert h.serialize(members_of(vector["state"])) == vector["header"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_parses_back(vector: dict[str, Any]) -> None:
    """OAI-GRAM-01: the value is an RFC 8941 List, and parse() inverts serialize()."""
    members = members_of(vector["state"]) or [h.NoneMember()]
    assert h.parse(vector["header"]) == h.ordered(members)
    assert str(sfv(vector["header"])) == vector["header"]


def test_vectors_are_enough_and_unique() -> None:
    ids = [v["id"] for v in VECTORS]
    assert len(ids) == len(set(ids)) and len(ids) >= 20


@pytest.mark.parametrize(
    ("members", "value"),
    [
        pytest.param(
            [h.InlineMember(sae=TV1_SAE, layer=11, features=1, hash=TV1_HASH)],
            f'inline;sae="{TV1_SAE}";layer=11;features=1;hash="{TV1_HASH}"',
            id="GRAM-28",
        ),
        pytest.param(
            [h.CircuitMember("crc_124fd83d1f2a", 0.5, changed=True)],
            'circuit;id="crc_124fd83d1f2a";intensity="0.5";changed',
            id="GRAM-30",
        ),
        pytest.param(
            [h.Unknown("claims_unreadable")], "unknown;reason=claims_unreadable", id="GRAM-31"
        ),
        pytest.param([], "none", id="GRAM-27"),
    ],
)
def test_requirement_examples(members: list[h.Member], value: str) -> None:
    """OAI-GRAM-27, -28, -30, -31: the values REQ-000 spells out."""
    assert h.serialize(members) == value


def test_active_profile_form() -> None:
    """OAI-GRAM-29: the active-profile form, no spaces inside a member."""
    applied = {i: 1.0 for i in range(12)}
    member = h.profile_member("humor", "active", 1.0, TV1_SAE, layer=11, applied=applied)
    value = h.serialize([member])
    assert value == (
        f'profile;name="humor";source=active;intensity="1.0";sae="{TV1_SAE}";layer=11;'
        f'features=12;hash="{steering_set_hash(TV1_SAE, applied.items())}"'
    )
    assert " " not in value


def test_applied_member_helpers_compute_features_and_hash() -> None:
    """OAI-HASH-18, -19, OAI-GRAM-15: TV-4 sent inline gives clamped=1 and TV-4's hash."""
    member = h.inline_member(TV3_SAE, 20, {3: 200.0, 8: 0.0, 9: -0.0}, clamped=1)
    assert (member.features, member.hash, member.clamped) == (1, TV4_HASH, 1)
    assert h.serialize([member]).endswith(f'features=1;hash="{TV4_HASH}";clamped=1')
    manual = h.manual_member(TV1_SAE, 11, {1234: 8.0})
    assert (manual.features, manual.hash) == (1, TV1_HASH)


def test_changed_flag_marks_every_member() -> None:
    """OAI-GRAM-23: `changed` on every member; the flag and with_changed() agree."""
    members: list[h.Member] = [
        h.InlineMember(sae=TV1_SAE, layer=11, features=1, hash=TV1_HASH),
        h.CircuitMember("crc_a", 1.0),
    ]
    value = h.serialize(members, changed=True)
    assert value == h.serialize(h.with_changed(members))
    assert all(item.params.get("changed") is True for item in sfv(value))
    assert h.serialize([], changed=True) == "none;changed"
    with pytest.raises(ValueError, match="every member"):
        h.serialize([members[0], h.with_changed([members[1]])[0]])


@pytest.mark.parametrize(
    "members",
    [
        [h.NoneMember(), h.InlineMember(sae=TV1_SAE, layer=11, features=1, hash=TV1_HASH)],
        [h.Unknown("read_failed"), h.CircuitMember("c", 1.0)],
        [h.NoneMember(), h.NoneMember()],
        [h.CircuitMember("c", 1.0), h.CircuitMember("c", 2.0)],
    ],
)
def test_serialize_refuses_impossible_lists(members: list[h.Member]) -> None:
    """OAI-GRAM-05, -06, -12: none/unknown stand alone; one member per circuit."""
    with pytest.raises(ValueError):
        h.serialize(members)


@pytest.mark.parametrize(
    "build",
    [
        lambda: h.Unknown("bad_reason"),
        lambda: h.ProfileMember(
            name="p", source="global", intensity=1.0, sae="s", layer=1, features=1, hash=TV1_HASH
        ),
        lambda: h.ProfileMember(
            name="p",
            source="active",
            intensity=math.nan,
            sae="s",
            layer=1,
            features=1,
            hash=TV1_HASH,
        ),
        lambda: h.InlineMember(sae="s", layer=1, features=1, hash=TV1_HASH.upper()),
        lambda: h.InlineMember(sae="s", layer=1, features=1, hash="sha256:abc"),
        lambda: h.InlineMember(sae="s", layer=-1, features=1, hash=TV1_HASH),
        lambda: h.InlineMember(sae="s", layer=1, features=1, hash=TV1_HASH, clamped=-1),
        lambda: h.InlineMember(sae="sæ", layer=1, features=1, hash=TV1_HASH),
        lambda: h.ManualMember(sae="s", layer=True, features=1, hash=TV1_HASH),
        lambda: h.CircuitMember("c\n", 1.0),
        lambda: h.CircuitMember("c", math.inf),
    ],
)
def test_members_refuse_values_the_grammar_cannot_hold(build: Any) -> None:
    """OAI-GRAM-13..24: parameter types and ranges are checked when a member is built."""
    with pytest.raises(ValueError):
        build()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "steered",
        "none;changed=?1",
        "none;changed=?0",
        "unknown;reason=other",
        'unknown;reason="read_failed"',
        f'inline;layer=11;sae="s";features=1;hash="{TV1_HASH}"',
        f'inline;sae="s";layer=11;hash="{TV1_HASH}"',
        f'inline;sae="s";layer=11;features=1;hash="{TV1_HASH}";clamped=0',
        f'inline;sae="s";layer=11;features=1;hash="{TV1_HASH}";extra=1',
        f'manual;sae="s";layer=11;features=1;hash="{TV1_HASH}";clamped=1',
        f'inline;sae=s;layer=11;features=1;hash="{TV1_HASH}"',
        'circuit;id="c";intensity=0.5',
        'circuit;id="c";intensity="1"',
        'circuit;id="c";intensity="0.50"',
        'circuit;id="b";intensity="1.0", circuit;id="a";intensity="1.0"',
        f'inline;sae="s";layer=12;features=1;hash="{TV1_HASH}", circuit;id="a";intensity="1.0"',
        f'inline;sae="s";layer=12;features=1;hash="{TV1_HASH}", none',
        f'profile;name="a%zz";source=active;intensity="1.0";sae="s";layer=1;features=1;hash="{TV1_HASH}"',
        f'profile;name="a%c3%a9";source=active;intensity="1.0";sae="s";layer=1;features=1;hash="{TV1_HASH}"',
        "(none), none",
    ],
)
def test_parse_refuses_what_the_grammar_forbids(value: str) -> None:
    """OAI-GRAM-02..-26 read back: order, types, bare booleans, optional params, member order."""
    with pytest.raises(ValueError):
        h.parse(value)


def test_parse_accepts_rfc8941_whitespace() -> None:
    """Parsers accept any OWS around the list commas (sf-list)."""
    value = 'circuit;id="a";intensity="1.0" ,\tcircuit;id="b";intensity="2.0"'
    assert h.parse(value) == [h.CircuitMember("a", 1.0), h.CircuitMember("b", 2.0)]


# Hypothesis: any valid member list serialises to a parseable RFC 8941 List.
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
counts = st.integers(min_value=0, max_value=10**15 - 1)
intensities = st.floats(allow_nan=False, allow_infinity=False)
hashes = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())
sae_items = st.one_of(
    st.builds(
        h.ProfileMember,
        name=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
        source=st.sampled_from(h.SOURCES),
        intensity=intensities,
        sae=printable,
        layer=counts,
        features=counts,
        hash=hashes,
        clamped=counts,
    ),
    st.builds(
        h.InlineMember, sae=printable, layer=counts, features=counts, hash=hashes, clamped=counts
    ),
    st.builds(h.ManualMember, sae=printable, layer=counts, features=counts, hash=hashes),
)
circuits = st.builds(h.CircuitMember, id=printable, intensity=intensities, composed=st.booleans())
steered = st.tuples(
    st.lists(circuits, max_size=4, unique_by=lambda c: c.id), st.lists(sae_items, max_size=6)
).map(lambda pair: [*pair[0], *pair[1]])
alone = st.one_of(
    st.builds(h.NoneMember).map(lambda m: [m]),
    st.builds(h.Unknown, reason=st.one_of(st.none(), st.sampled_from(h.REASONS))).map(
        lambda m: [m]
    ),
)
member_lists = st.tuples(st.one_of(steered, alone), st.booleans()).map(
    lambda pair: h.with_changed(pair[0]) if pair[1] else pair[0]
)


@given(member_lists)
def test_serialize_is_an_sf_list_and_parse_inverts_it(members: list[h.Member]) -> None:
    """OAI-GRAM-01..-04, -25, -26: a valid List; kinds, order and parameters as specified."""
    value = h.serialize(members)
    parsed = sfv(value)
    assert str(parsed) == value
    assert "=?" not in re.sub(r'"(?:[^"\\]|\\.)*"', '""', value)
    expected = h.ordered(members or [h.NoneMember()])
    assert h.parse(value) == expected
    for item, member in zip(parsed, expected, strict=True):
        kind = h.MEMBER_KINDS[type(member)]
        assert str(item.value) == kind
        order = h.ORDER[kind]
        assert list(item.params) == [p for p in order if p in item.params]
        assert set(order) - set(item.params) <= h.OPTIONAL


@given(intensities)
def test_intensity_is_a_string_that_round_trips(intensity: float) -> None:
    """OAI-GRAM-20: `intensity` is a String holding repr(float); parsing gives the same float."""
    value = h.serialize([h.CircuitMember("c", intensity)])
    (item,) = sfv(value)
    assert isinstance(item.params["intensity"], str)
    assert item.params["intensity"] == repr(intensity)
    (member,) = h.parse(value)
    assert isinstance(member, h.CircuitMember)
    assert member.intensity == intensity and math.copysign(1, member.intensity) == math.copysign(
        1, intensity
    )


@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_profile_name_percent_encoding(name: str) -> None:
    """OAI-GRAM-18: only %x20-7E minus %, ", \\ stay literal; the rest is uppercase %XX."""
    encoded = h.encode_name(name)
    assert h.decode_name(encoded) == name
    assert all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in encoded)
    assert re.fullmatch(r"(?:[^%]|%[0-9A-F]{2})*", encoded)
    kept = "".join(c for c in name if 0x20 <= ord(c) <= 0x7E and c not in '%"\\')
    assert "".join(re.split(r"%[0-9A-F]{2}", encoded)) == kept


def test_booleans_are_bare() -> None:
    """OAI-GRAM-22, -26: `composed` and `changed` are written bare, never `=?1`."""
    member = h.CircuitMember("c", 1.0, composed=True, changed=True)
    assert h.serialize([member]) == 'circuit;id="c";intensity="1.0";composed;changed'
    assert h.serialize([dataclasses.replace(member, composed=False, changed=False)]) == (
        'circuit;id="c";intensity="1.0"'
    )


def abnf_rules() -> dict[str, str]:
    """spec/grammar/steering-header.abnf as rule name -> body, comments dropped."""
    text = (resources.files("miserver.spec") / "grammar" / "steering-header.abnf").read_text()
    rules: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        line = re.sub(r'^((?:[^";]|"[^"]*")*);.*$', r"\1", line).rstrip()
        if match := re.match(r"^([A-Za-z][\w-]*)\s*=\s*(.*)$", line):
            name, rules[name] = match[1], match[2]
        elif line.strip() and name:
            rules[name] += " " + line.strip()
    return rules


@pytest.mark.parametrize("kind", sorted(h.ORDER))
def test_grammar_file_agrees_with_the_parameter_order(kind: str) -> None:
    """OAI-GRAM-03: spec/grammar/steering-header.abnf lists each kind's parameters in order."""
    rules = abnf_rules()
    body = rules[f"{kind}-member"].replace("sae-params", rules["sae-params"])
    assert body.startswith(f'"{kind}"')
    found = re.findall(r'";(\w+)="|\b(clamped|changed|composed)\b', body)
    assert [literal or ref for literal, ref in found] == list(h.ORDER[kind])
