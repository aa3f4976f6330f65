"""The request path's shape holds (issue 41; docs/ARCHITECTURE.md, tools/figures.py)."""

from __future__ import annotations

from tools import figures


def test_the_limits_hold() -> None:
    """CompletionService at most 300 lines, no function in impl/ over 50, no
    NotImplementedError in impl/engines, no import circle anywhere."""
    assert figures.broken() == []


def test_a_broken_limit_is_named() -> None:
    """The check can fail: the longest function in the tree is over the limit."""
    longest = max(figures.folder("tests").functions, key=lambda f: f.length)
    assert longest.length > figures.MAX_FUNCTION_LINES
    assert longest in figures.long_functions("tests")


def test_the_report_names_every_form_and_protocol() -> None:
    report = figures.report()
    for _, name in figures.FORMS:
        assert f"`{name}`" in report
    assert "optional `Scorer`" in report and "| import circles | none |" in report
