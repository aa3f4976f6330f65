"""The hostile-input corpus (tests/data/hostile/) is what its generator writes, and well formed.

The e2e test (tests/e2e/test_hostile.py) sends it; these checks need no server.
"""

from __future__ import annotations

from collections import Counter

from tools.hostile import client, corpus, generate, targets

MIN_CASES = 500  # issue 24


def test_the_corpus_is_what_the_generator_writes() -> None:
    """Run `python -m tools.hostile` after changing tools/hostile/ or spec/openapi."""
    assert generate.differences(corpus.DATA) == []


def test_every_route_of_both_documents_is_a_target() -> None:
    assert targets.uncovered() == []


def test_the_corpus_holds_at_least_500_cases_with_unique_ids() -> None:
    cases = [case for family in corpus.families() for case in corpus.cases(family)]
    assert len(cases) >= MIN_CASES
    repeated = [id for id, n in Counter(case.id for case in cases).items() if n > 1]
    assert repeated == []
    assert {case.family for case in cases} == set(corpus.families())


def test_every_case_names_known_routes_and_catalogued_codes() -> None:
    known = corpus.targets()
    for family in corpus.families():
        for case in corpus.cases(family):
            assert set(case.routes) <= set(known), case.id
            code = case.expect.code
            codes = code.values() if isinstance(code, dict) else [code]
            assert {c for c in codes if c is not None} <= set(client.catalog()), case.id


def test_templates_expand_to_the_bytes_they_stand_for() -> None:
    parts: list[corpus.Part] = [
        "{",
        {"repeat": [["[", {"b64": "Ww=="}], 2]},
        "1",
        {"repeat": ["]", 4]},
        "}",
    ]
    assert corpus.expand(parts) == b"{[[[[1]]]]}"
    assert corpus.expand("\u00e9") == b"\xc3\xa9"
