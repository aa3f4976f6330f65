"""The run as text (a table per requirement ID, then the details) or as JSON.

Requirement    Check                        Outcome
OAI-EP-04      models_list_shape            passed
OAI-STREAM-02  chat_stream_framing          FAILED
...
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from .runner import Outcome, Report

# REQ-000's section tags in source order, so that IDs sort as the document reads.
SECTIONS = (  # noqa: SIM905 (one line of tags reads as the document's list does)
    "GEN EP CHAT DIAL CIRCUIT RUNG CONC SINT RESP STREAM PROF INL PROBE HDR GRAM HASH CMPL SCORE "
    "F32 ACT EMB MODELS GGUF CONT VALID CSCORE TOKIDS SO TOOLS SEED ERR CBM INTEG"
).split()
SHOWN = {
    Outcome.PASSED: "passed",
    Outcome.FAILED: "FAILED",
    Outcome.NOT_OFFERED: "not offered",
    Outcome.ERROR: "ERROR",
}

COUNTED = {
    Outcome.PASSED: "passed",
    Outcome.FAILED: "failed",
    Outcome.NOT_OFFERED: "not offered",
    Outcome.ERROR: "errored",
}


def requirement_key(requirement: str) -> tuple[int, str, int]:
    """`OAI-STREAM-02` -> (section position, section, 2)."""
    _, section, number = requirement.split("-")
    position = SECTIONS.index(section) if section in SECTIONS else len(SECTIONS)
    return (position, section, int(number))


def rows(report: Report) -> list[tuple[str, str, str]]:
    """(requirement, check, outcome) for every ID every check covers, in document order."""
    found = [
        (requirement, result.check.name, SHOWN[result.outcome])
        for result in report.results
        for requirement in result.check.requirements
    ]
    return sorted(found, key=lambda row: (requirement_key(row[0]), row[1]))


def _table(lines: list[tuple[str, str, str]]) -> list[str]:
    header = ("Requirement", "Check", "Outcome")
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(2)]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}".rstrip() for a, b, c in [header, *lines]]


def _details(report: Report) -> list[str]:
    out: list[str] = []
    for result in report.results:
        if result.outcome == Outcome.PASSED:
            continue
        failure = result.failure
        if failure is not None:
            where = f" [{failure.requirement}]" if failure.requirement else ""
            out += [
                f"- {result.check.name}{where}: {failure.title}",
                f"    expected: {failure.expected}",
                f"    received: {failure.received}",
            ]
        else:
            out.append(f"- {result.check.name}: {SHOWN[result.outcome]}: {result.detail}")
    return out


def summary(report: Report) -> str:
    counts = {outcome: 0 for outcome in Outcome}
    for result in report.results:
        counts[result.outcome] += 1
    parts = ", ".join(f"{counts[o]} {COUNTED[o]}" for o in Outcome)
    return f"{len(report.results)} checks: {parts}"


def write_text(report: Report, out: TextIO) -> None:
    lines = [f"miserver-conformance: {report.base_url} (model {report.model})", ""]
    lines += _table(rows(report))
    details = _details(report)
    if details:
        lines += ["", "Details:", *details]
    lines += ["", summary(report)]
    out.write("\n".join(lines) + "\n")


def as_json(report: Report) -> dict[str, Any]:
    return {
        "base_url": report.base_url,
        "model": report.model,
        "exit_code": report.exit_code,
        "checks": [
            {
                "name": r.check.name,
                "requirements": list(r.check.requirements),
                "outcome": r.outcome.value,
                "detail": r.detail,
                "failure": None
                if r.failure is None
                else {
                    "title": r.failure.title,
                    "requirement": r.failure.requirement,
                    "expected": r.failure.expected,
                    "received": r.failure.received,
                },
                "seconds": round(r.seconds, 3),
            }
            for r in report.results
        ],
    }


def write_json(report: Report, out: TextIO) -> None:
    out.write(json.dumps(as_json(report), indent=2) + "\n")
