"""What a run does (`Plan`) and what it prints: the rows, the table and the header."""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

log = logging.getLogger("device_check")


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run does: where, how many tokens a generation, how many rows, how many rounds."""

    device: torch.device
    tokens: int
    rows: int  # rows of the batch and the steering checks
    speed_rows: int  # C of the speed check
    rounds: int
    threads: int  # torch threads (0: the loader's default, the usable cores)
    quick: bool
    work: Path

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def name(self) -> str:
        """`cpu` or `cuda:N`: how a model's facts and /api/health/inference name it."""
        return str(self.device)


def plan_of(args: argparse.Namespace, work: Path) -> Plan:
    wanted = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(wanted)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    quick = bool(args.quick) or device.type != "cuda"
    return Plan(
        device=device,
        tokens=args.tokens or (8 if quick else 128),
        rows=4 if quick else 8,
        speed_rows=4 if quick else 32,
        rounds=1 if quick else 3,
        threads=args.threads,
        quick=quick,
        work=work,
    )


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the table: `passed` None is a figure (a timing, against `goal` or none)."""

    check: str
    compared: str
    figure: str
    passed: bool | None
    goal: str = ""

    @property
    def result(self) -> str:
        if self.passed is None:
            return self.goal or "figure"
        return "pass" if self.passed else "**FAIL**"


def guarded(check: str, run: Callable[[], list[Row]]) -> list[Row]:
    """The check's rows; one failing row naming the error when it raises."""
    try:
        return run()
    except Exception as exc:
        log.exception("%s failed", check)
        return [Row(check, "-", f"error: {type(exc).__name__}: {exc}"[:300], False)]


def table(rows: Sequence[Row]) -> str:
    lines = ["| check | compared | figure | result |", "|---|---|---|---|"]
    for row in rows:
        cells = (row.check, row.compared, row.figure, row.result)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def header(plan: Plan) -> str:
    if plan.gpu:
        device = f"{plan.name} ({torch.cuda.get_device_name(plan.device)})"
        cuda = f" (CUDA {torch.version.cuda})"
    else:
        device, cuda = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)", ""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"device: {device}; torch {torch.__version__}{cuda}; transformers "
        f"{transformers.__version__}; Python {platform.python_version()}; {when}\n"
        f"{plan.tokens} tokens a generation; {plan.rows} rows (batch, steering), "
        f"{plan.speed_rows} (speed); {plan.rounds} round(s); quick: {plan.quick}\n\n"
    )
