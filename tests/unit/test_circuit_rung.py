"""X-miLLM-Circuit-Rung (REQ-000 RUNG) over spec/vectors/circuit-rung-header.json."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from miserver.steering.rung import (
    CAUSAL_FROM,
    LANGUAGE,
    CircuitState,
    RequestState,
    parse,
    rung_header,
    serialize,
)

VECTORS: dict[str, list[dict[str, Any]]] = json.loads(
    (resources.files("miserver.spec") / "vectors" / "circuit-rung-header.json").read_text("utf-8")
)


@pytest.mark.parametrize(
    "vector", VECTORS["decisions"], ids=[v["id"] for v in VECTORS["decisions"]]
)
def test_when_the_header_is_sent_and_what_it_says(vector: dict[str, Any]) -> None:
    """OAI-RUNG-01, -05..17 (open point 17): each vector's circuits and request give its
    header exactly, or none; a sent header parses back to its rung and phrase."""
    circuits = [CircuitState(**c) for c in vector["circuits"]]
    header = rung_header(circuits, RequestState(**vector["request"]))
    assert header == vector["header"]
    if header is not None:
        rung, language = parse(header)
        assert LANGUAGE[rung] == language


@pytest.mark.parametrize("vector", VECTORS["parses"], ids=[v["id"] for v in VECTORS["parses"]])
def test_the_spaced_form_parses_to_the_canonical_one(vector: dict[str, Any]) -> None:
    """OAI-RUNG-02 (open point 18): `2; language="..."` and the canonical `2;language="..."`
    parse alike, and the server writes the canonical form."""
    assert parse(vector["value"]) == (vector["rung"], vector["language"])
    assert serialize(vector["rung"]) == vector["canonical"]
    assert parse(vector["canonical"]) == (vector["rung"], vector["language"])


def test_the_phrases_are_the_servers_own() -> None:
    """OAI-RUNG-02..08: the phrase is the rung's, never another; below rung 2 it never says
    causal; anything but a rung 0-3 with its own phrase is refused."""
    assert serialize(2) == '2;language="causally validated (edge)"'
    for rung, phrase in LANGUAGE.items():
        assert rung >= CAUSAL_FROM or "causal" not in phrase
    for bad in (-1, 4, True, "2"):
        with pytest.raises(ValueError):
            serialize(bad)  # type: ignore[arg-type]
    for value in ('2;language="associated"', '5;language="associated"', "2", '"2"'):
        with pytest.raises(ValueError):
            parse(value)
    assert len(VECTORS["decisions"]) + len(VECTORS["parses"]) >= 20
