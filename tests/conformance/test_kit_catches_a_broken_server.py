"""The kit against a fake server over real HTTP: it passes a correct one, says "not offered"
for a plain OpenAI one, and reports each deliberate fault by its requirement ID with exit 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from miserver.conformance import Outcome, run
from miserver.conformance.checks import all_checks
from miserver.conformance.cli import main
from miserver.conformance.runner import EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE
from tests.conformance.conftest import serving
from tests.conformance.fake import FAULTS, fake_app

pytestmark = pytest.mark.e2e

EXAMPLES = "3"
EXTENSION_CHECKS = {
    "activations_reply",
    "activations_stream_chunk",
    "probe_verdicts_reply",
    "probe_verdicts_stream_chunk",
    "probe_trace_context",
    "openapi_conformance",
    "completion_scoring_shape",
    "chat_scoring_shape",
    "logprobs_score_or_generate",
    "chat_generation_logprobs",
    "completion_echo_logprobs",
    "stream_steering_chunk",
    "steering_header_grammar",
    "inline_steering_hash",
    "ignored_fields_reported",
    "strict_mode_refuses_ignored_fields",
    "circuit_rung_header",
    "circuit_member_hash",
    "cluster_member_hash",
    "response_object_shape",  # the plain fake predates the Responses API: 404
    "response_stream_events",
}
# fault -> (the check that must fail, the requirement ID its failure names)
CAUGHT = {
    "error_shape": ("invalid_request_error_shape", "OAI-ERR-01"),
    "stream_no_done": ("chat_stream_framing", "OAI-STREAM-02"),
    "steering_grammar": ("steering_header_grammar", "OAI-GRAM-03"),
    "steering_hash": ("inline_steering_hash", "OAI-HASH-19"),
    "models_content_type": ("openapi_conformance", "OAI-ERR-01"),
    "usage_twice": ("chat_stream_framing", "OAI-STREAM-05"),
    "steering_created_zero": ("stream_steering_chunk", "OAI-HDR-15"),
    "lenient_json": ("strict_json_bodies", "OAI-VALID-01"),
    "lenient_values": ("unrepresentable_values_refused", "OAI-ERR-01"),
    "activations_last_token": ("activations_reply", "OAI-ACT-05"),
    "probe_verdicts_unsorted": ("probe_verdicts_reply", "OAI-PROBE-03"),
    "rung_grammar": ("circuit_rung_header", "OAI-RUNG-06"),
    "circuit_hash": ("circuit_member_hash", "OAI-CIRCUIT-09"),
    "cluster_hash": ("cluster_member_hash", "OAI-HASH-06"),
    "logprobs_need_one_token": ("logprobs_score_or_generate", "OAI-SCORE-32"),
    "logprobs_one_entry": ("chat_generation_logprobs", "OAI-CSCORE-14"),
    "echo_first_scored": ("completion_echo_logprobs", "OAI-SCORE-15"),
    "response_usage_names": ("response_object_shape", "MIS-RESPONSES-01"),
    "response_events_unnumbered": ("response_stream_events", "MIS-RESPONSES-04"),
}


def test_every_fault_has_an_expectation() -> None:
    assert set(CAUGHT) == set(FAULTS)


@pytest.fixture(scope="module")
def correct() -> Iterator[str]:
    with serving(fake_app()) as origin:
        yield f"{origin}/v1"


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    with serving(fake_app(extensions=False)) as origin:
        yield f"{origin}/v1"


def test_a_correct_server_passes_every_check(correct: str) -> None:
    """OAI-ERR-01, OAI-STREAM-01..05, OAI-HDR-12..16, OAI-INL-29, OAI-HASH-19, OAI-VALID-02..13:
    the control: a fake that keeps the contract passes every check, exit 0."""
    report = run(correct, max_examples=int(EXAMPLES))
    assert {r.check.name: r.outcome for r in report.results} == {
        c.name: Outcome.PASSED for c in all_checks()
    }, [r.detail for r in report.results if r.outcome != Outcome.PASSED]
    assert report.exit_code == EXIT_OK


def test_a_server_without_extensions_gets_not_offered(plain: str) -> None:
    """OAI-GEN-02, OAI-VALID-02, OAI-HDR-01, OAI-SCORE-01, OAI-INL-29: a plain OpenAI server
    (no X-miLLM headers, no scoring, no /api, no OpenAPI document) gets "not offered" for every
    extension check, never a crash or a failure; the core checks pass; exit 0."""
    report = run(plain, max_examples=int(EXAMPLES))
    outcomes = {r.check.name: r.outcome for r in report.results}
    assert {n for n, o in outcomes.items() if o == Outcome.NOT_OFFERED} == EXTENSION_CHECKS
    assert {n for n, o in outcomes.items() if o != Outcome.NOT_OFFERED} == {
        n for n, o in outcomes.items() if o == Outcome.PASSED
    }
    assert report.exit_code == EXIT_OK


@pytest.mark.parametrize("fault", sorted(CAUGHT))
def test_each_fault_is_reported_by_requirement_id(
    fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """OAI-ERR-01, OAI-STREAM-02, OAI-STREAM-05, OAI-HDR-15, OAI-GRAM-03, OAI-HASH-19,
    OAI-VALID-01, OAI-ACT-05, OAI-PROBE-03, OAI-SCORE-15, OAI-SCORE-32, OAI-CSCORE-14: the table
    marks the broken ID's row FAILED, the details name the ID and say what was expected, and the
    exit status is 1. The old stream endings (usage on the finish chunk and on a usage chunk; a
    steering chunk of its own with created 0), a body read as lenient JSON (contract 0.4.0) and
    `logprobs` refused beside `max_tokens` other than 1 (contract 0.17.0, issue 42) are faults
    now."""
    name, requirement = CAUGHT[fault]
    with serving(fake_app(frozenset({fault}))) as origin:
        code = main(
            ["--base-url", f"{origin}/v1", "--check", name, "--max-examples", EXAMPLES, "-q"]
        )
    out = capsys.readouterr().out
    assert code == EXIT_FAILED, out
    assert re.search(rf"^{requirement}\s+{name}\s+FAILED$", out, re.MULTILINE), out
    assert re.search(
        rf"^- {name} \[{requirement}\]: .+\n    expected: .+\n    received: ", out, re.MULTILINE
    ), out


def test_json_report_names_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON report: every check with its IDs, outcome and the failure's requirement."""
    with serving(fake_app(frozenset({"stream_no_done"}))) as origin:
        code = main(
            ["--base-url", f"{origin}/v1", "--check", "chat_stream_framing", "--json", "-q"]
        )
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit_code"] == EXIT_FAILED
    [entry] = report["checks"]
    assert entry["outcome"] == "failed"
    assert entry["failure"]["requirement"] == "OAI-STREAM-02"
    assert "OAI-STREAM-04" in entry["requirements"]


def test_an_unreachable_server_or_unknown_check_exits_2(correct: str) -> None:
    """Nothing checked is not a pass: exit 2 when the kit cannot run at all."""
    assert main(["--base-url", "http://127.0.0.1:9/v1", "-q"]) == EXIT_UNUSABLE
    assert main(["--base-url", correct, "--check", "no_such_check", "-q"]) == EXIT_UNUSABLE
    assert main(["-q"]) == EXIT_UNUSABLE


def test_api_key_is_sent_on_every_request(capsys: pytest.CaptureFixture[str]) -> None:
    """`--api-key KEY` goes out as `Authorization: Bearer KEY` on every request (the
    kit's own and Schemathesis'); without it a keyed server cannot be checked (exit 2)."""
    with serving(fake_app(api_key="s3cret")) as origin:
        base = f"{origin}/v1"
        keyed = main(["--base-url", base, "--api-key", "s3cret", "--max-examples", EXAMPLES, "-q"])
        out = capsys.readouterr().out
        assert keyed == EXIT_OK, out
        assert main(["--base-url", base, "-q"]) == EXIT_UNUSABLE
