"""A probe asked in a process of its own (REQ-003 PLAN-07): the server started again with a
`--probe-*` flag, its JSON answer on stdout, within a time limit. Whatever the child does,
crash, hang or garble, the server hears an answer or why there is none."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any


def answer(command: Sequence[str], timeout_s: float, what: str) -> tuple[Any, str]:
    """The child's answer as JSON and ""; or None and why, worded for `what` (the probe's
    name in a sentence)."""
    try:
        done = subprocess.run(list(command), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"{what} did not answer within {timeout_s:.0f} s"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"{what} ended with status {done.returncode}: {said[-1:]}"
    try:
        return json.loads(done.stdout), ""
    except ValueError:
        return None, f"{what}'s answer is not JSON"
