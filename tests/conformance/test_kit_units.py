"""The kit's pure parts: SSE framing, the registry, the report."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from miserver.conformance import Outcome, Report, Result, all_checks, check
from miserver.conformance.checks import select
from miserver.conformance.events import read_stream
from miserver.conformance.failures import StreamFramingViolation
from miserver.conformance.report import requirement_key, rows, write_text

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT.parent / "shared" / "requirements"
CHUNK = '{"object": "chat.completion.chunk", "choices": []}'


def test_read_stream_splits_events_and_drops_comments() -> None:
    """OAI-STREAM-01/02: `data:` events, comment lines between them, CRLF line ends."""
    body = f": waiting for a turn\r\n\r\ndata: {CHUNK}\r\n\r\ndata: {CHUNK}\n\ndata: [DONE]\n\n"
    stream = read_stream(body)
    assert stream.done
    assert len(stream.chunks) == 2


@pytest.mark.parametrize(
    ("body", "requirement"),
    [
        (f"data: {CHUNK}\n\ndata: [DONE]\n", "OAI-STREAM-01"),
        (f"event: error\ndata: {CHUNK}\n\n", "OAI-STREAM-01"),
        (f"data:{CHUNK}\n\n", "OAI-STREAM-01"),
        ("data: not json\n\n", "OAI-STREAM-01"),
        ("data: [1, 2]\n\n", "OAI-STREAM-01"),
        (f"data: [DONE]\n\ndata: {CHUNK}\n\n", "OAI-STREAM-02"),
    ],
    ids=["no-blank-line", "event-field", "no-space", "not-json", "not-object", "after-done"],
)
def test_read_stream_refuses_other_framing(body: str, requirement: str) -> None:
    with pytest.raises(StreamFramingViolation) as refused:
        read_stream(body)
    assert refused.value.requirement == requirement


def test_a_stream_without_done_is_read_as_not_done() -> None:
    assert not read_stream(f"data: {CHUNK}\n\n").done


def test_checks_need_requirement_ids() -> None:
    with pytest.raises(ValueError):
        check()
    with pytest.raises(ValueError):
        check("STREAM-02")


def test_every_check_names_real_requirement_ids() -> None:
    """Each ID a check is tagged with exists: an `OAI-` one in REQ-000
    (../shared/requirements), a `MIS-` one (the contract's own, past REQ-000) in the list of
    docs/CONFORMANCE.md."""
    document = REQUIREMENTS / "REQ-000-openai-api.md"
    if not document.is_file():
        pytest.skip(f"{document} is not beside this checkout")
    known = set(re.findall(r"^- \[.\] (OAI-[A-Z0-9]+-\d{2}) ", document.read_text("utf-8"), re.M))
    ours = (ROOT / "docs" / "CONFORMANCE.md").read_text("utf-8")
    known |= set(re.findall(r"^- (MIS-[A-Z0-9]+-\d{2}) ", ours, re.M))
    tagged = {rid for c in all_checks() for rid in c.requirements}
    assert tagged <= known, sorted(tagged - known)


def test_select_and_skip() -> None:
    names = [c.name for c in select(["chat_stream_framing", "models_list_shape"])]
    assert names == [c.name for c in all_checks() if c.name in names] and len(names) == 2
    assert "models_list_shape" not in [c.name for c in select(skip=["models_list_shape"])]
    with pytest.raises(KeyError):
        select(["no_such_check"])


def test_requirement_ids_sort_in_document_order() -> None:
    ids = ["OAI-ERR-01", "OAI-STREAM-10", "OAI-GEN-01", "OAI-STREAM-02", "OAI-HDR-01"]
    assert sorted(ids, key=requirement_key) == [
        "OAI-GEN-01",
        "OAI-STREAM-02",
        "OAI-STREAM-10",
        "OAI-HDR-01",
        "OAI-ERR-01",
    ]


def test_report_has_one_row_per_requirement_and_check() -> None:
    checks = {c.name: c for c in all_checks()}
    results = [
        Result(checks["chat_stream_framing"], Outcome.PASSED),
        Result(checks["inline_steering_hash"], Outcome.NOT_OFFERED, "no SAE attached"),
    ]
    report = Report("http://x/v1", "m", results)
    table = rows(report)
    assert ("OAI-STREAM-04", "chat_stream_framing", "passed") in table
    assert ("OAI-HASH-19", "inline_steering_hash", "not offered") in table
    assert len(table) == sum(len(r.check.requirements) for r in results)
    out = io.StringIO()
    write_text(report, out)
    assert "inline_steering_hash: not offered: no SAE attached" in out.getvalue()
    assert report.exit_code == 0


def test_every_check_is_documented() -> None:
    """docs/CONFORMANCE.md has a row for every check, and no row for a check that is gone."""
    text = (ROOT / "docs" / "CONFORMANCE.md").read_text("utf-8")
    documented = set(re.findall(r"^\| `([a-z_]+)` \| (?:OAI|MIS)-", text, re.MULTILINE))
    assert documented == {c.name for c in all_checks()}
