"""The device check (tools/device_check/, issue 48 item 4) run on the CPU: the quick run
a GPU machine does at full size, here on one thread."""

from __future__ import annotations

import pytest

from tools import device_check

pytestmark = pytest.mark.model  # loads a model of SmolLM2's shape, several times

EQUALITIES = (
    "1 greedy: cpu = cpu",
    "1 greedy: engine = generate on cpu",
    "2 batch rows = alone on cpu",
    "3 steering: unsteered rows = alone",
    "3 steering: steered rows differ",
    "3 steering: X-miLLM-Steering",
    "4 activations = forward",
    "4 probe score = forward",
)
TIMINGS = ("5 decode tok/s, 1 row: server ÷ bare", "5 4-row gain: server ÷ bare")


def results(table: str) -> dict[str, str]:
    """Each row's check and its result cell, from the markdown table."""
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): cells[-1].strip() for cells in rows[1:]}


def test_every_equality_row_passes_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 48 item 4: `python -m tools.device_check --quick --device cpu` prints its header
    and one table, a row per check in order; every equality row passes (greedy ids, batch
    rows, per-row steering and its headers, activations and a probe score against a plain
    forward), the timing rows are figures with their GPU goals, and it exits 0."""
    code = device_check.main(["--quick", "--device", "cpu", "--threads", "1"])
    out = capsys.readouterr().out
    assert out.startswith("# Device check (issue 48 item 4)\n\ndevice: cpu"), out
    found = results(out)
    assert list(found) == [*EQUALITIES, *TIMINGS], out
    assert [found[check] for check in EQUALITIES] == ["pass"] * len(EQUALITIES), out
    assert all(found[check].startswith("figure (goal >=") for check in TIMINGS), out
    assert code == 0, out
