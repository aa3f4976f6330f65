"""X-miLLM-Ignored-Fields, X-miLLM-Strict and X-miLLM-Seed values."""

from __future__ import annotations

import http_sfv
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miserver import headers
from miserver.errors import ApiError
from miserver.serving.policy import percent_encode_field


def parse_list(value: str) -> list[str]:
    parsed = http_sfv.List()
    parsed.parse(value.encode())
    return [item.value for item in parsed]


def test_ignored_fields_is_an_sf_list_of_strings() -> None:
    """OAI-VALID-03: an RFC 8941 List of Strings giving locations."""
    value = headers.ignored_fields(["foo", "messages[2].name", 'a"b\\c'], 1024)
    assert value is not None
    assert parse_list(value) == ["foo", "messages[2].name", 'a"b\\c']


def test_ignored_fields_absent_when_nothing_ignored() -> None:
    """OAI-VALID-04."""
    assert headers.ignored_fields([], 1024) is None


@given(
    st.lists(
        st.text(
            alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40
        ),
        min_size=1,
        max_size=200,
    ),
    st.integers(min_value=16, max_value=2048),
)
def test_ignored_fields_cap_keeps_a_prefix_and_counts_the_rest(
    locations: list[str], cap: int
) -> None:
    """OAI-VALID-08: capped at the byte limit, last entry "+N more" counting what was left out."""
    value = headers.ignored_fields(locations, cap)
    assert value is not None
    items = parse_list(value)
    if items[-1].startswith("+") and items[-1].endswith(" more") and items != locations:
        kept = items[:-1]
        assert kept == locations[: len(kept)]
        assert items[-1] == f"+{len(locations) - len(kept)} more"
        assert len(value.encode()) <= cap or kept == []
    else:
        assert items == locations
        assert len(value.encode()) <= cap


def test_default_cap_is_1024_bytes() -> None:
    """OAI-VALID-08: 1,024 bytes with the "+N more" entry included."""
    value = headers.ignored_fields([f"field_{i:04d}" for i in range(300)], 1024)
    assert value is not None and len(value.encode()) <= 1024
    assert parse_list(value)[-1].endswith(" more")


@pytest.mark.parametrize(
    ("name", "encoded"),
    [
        ("plain", "plain"),
        ("naïve", "na%C3%AFve"),
        ("tab\there", "tab%09here"),
        ("100%", "100%25"),
    ],
    ids=["OAI-VALID-09-ascii", "OAI-VALID-09-utf8", "OAI-VALID-09-control", "OAI-VALID-09-percent"],
)
def test_non_printable_field_names_are_percent_encoded(name: str, encoded: str) -> None:
    """OAI-VALID-09."""
    assert percent_encode_field(name) == encoded


@pytest.mark.parametrize(
    ("raw", "strict"),
    [(None, False), ("true", True), ("1", True), ("false", False), ("0", False)],
    ids=[
        "OAI-VALID-11-absent",
        "OAI-VALID-10-true",
        "OAI-VALID-10-1",
        "OAI-VALID-11-false",
        "OAI-VALID-11-0",
    ],
)
def test_strict_header_values(raw: str | None, strict: bool) -> None:
    """OAI-VALID-10, OAI-VALID-11."""
    given_headers = {} if raw is None else {headers.STRICT: raw}
    assert headers.strict_mode(given_headers) is strict


@pytest.mark.parametrize("raw", ["yes", "TRUE1", "", "2"])
def test_other_strict_values_are_refused_naming_the_header(raw: str) -> None:
    """OAI-VALID-12."""
    with pytest.raises(ApiError) as info:
        headers.strict_mode({headers.STRICT: raw})
    assert info.value.status == 400 and info.value.param == "X-miLLM-Strict"


def test_seed_header_is_an_sf_integer_with_scope() -> None:
    """OAI-SEED-04."""
    item = http_sfv.Item()
    item.parse(headers.seed(7, "request").encode())
    assert item.value == 7 and item.params["scope"] == "request"
