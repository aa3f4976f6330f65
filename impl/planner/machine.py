"""This machine as the planner measures it (REQ-003 PLAN-04, -05, -10, -31, LOAD-11).

The probes are quick and harmless: the cores this process may use
(engines/cores.py), memory (psutil), the models folder's free disk, the lock
ceiling (RLIMIT_MEMLOCK), a sequential read of the model file (at most
READ_S seconds), and the engine's own kernels on the model's shapes at each
candidate thread count (planner/kernels.py), timed in a child process
(`miserver serve --probe-kernels`). None allocates until failure and none
loads the model.

`Host` is the real machine; tests give `measure` a host of their own (8
cores, 2 GB free). Devices beyond the host are asked by planner/devices.py.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..engines import cores
from ..models import inspection
from . import child
from .kernels import Ask, Kernels, run

log = logging.getLogger(__name__)

READ_S = 0.5  # the model file's sequential read, at most
READ_CHUNK = 8 << 20
KERNELS_TIMEOUT_S = 60.0
CHILD = (sys.executable, "-m", "miserver.cli", "serve", "--probe-kernels")


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What the probes read; rates are per second, sizes in bytes."""

    physical_cores: int  # usable: affinity and CPU quota respected
    logical_cpus: int
    memory_total: int
    memory_available: int
    disk_free: int  # the models folder's
    lock_limit: int | None  # RLIMIT_MEMLOCK; None when unlimited
    lock_known: bool  # whether the limit could be read
    read_rate: float  # the model file's sequential read; 0 when not read
    kernels: tuple[Kernels, ...]  # by thread count, ascending; () when not timed
    kernels_why: str  # why there are none; "" when timed
    seconds: float  # what the probes took


def candidates(physical: int) -> tuple[int, ...]:
    """The thread counts the kernels are timed on: one, every physical core, and half
    of them on a machine of four or more."""
    return tuple(sorted({1, max(1, physical), max(1, physical // 2) if physical >= 4 else 1}))


class Host:
    """The probes of the real machine."""

    def __init__(self, *, isolated: bool = True, command: Sequence[str] = CHILD) -> None:
        self._isolated = isolated
        self._command = command

    def cores(self) -> tuple[int, int]:
        """(physical cores this process may use, logical CPUs it may use)."""
        return cores.usable_cores(), len(cores.allowed_cpus())

    def memory(self) -> tuple[int, int]:
        found = psutil.virtual_memory()
        return int(found.total), int(found.available)

    def disk_free(self, folder: Path) -> int:
        return inspection.disk_free(folder)

    def lock_limit(self) -> tuple[int | None, bool]:
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        except (OSError, ValueError):
            return None, False
        return (None if soft == resource.RLIM_INFINITY else int(soft)), True

    def read_rate(self, path: Path | None) -> float:
        """Bytes a second of a sequential read of `path` (its largest file when a folder),
        for at most READ_S; 0 when there is nothing to read."""
        target = _largest(path) if path is not None else None
        if target is None:
            return 0.0
        done = 0
        started = time.perf_counter()
        with target.open("rb", buffering=0) as handle:
            while time.perf_counter() - started < READ_S:
                chunk = handle.read(READ_CHUNK)
                if not chunk:
                    break
                done += len(chunk)
        seconds = time.perf_counter() - started
        return done / seconds if seconds > 0 else 0.0

    def kernels(self, ask: Ask) -> tuple[tuple[Kernels, ...], str]:
        """The engine's kernels timed as `ask` says, in a child unless not isolated; no
        timings and why when the child fails."""
        if not self._isolated:
            try:
                return tuple(run(ask)), ""
            except (RuntimeError, OSError, MemoryError, ValueError) as exc:
                return _lost(f"the kernel probe failed: {exc}")
        found, why = child.answer(
            [*self._command, ask.to_json()], KERNELS_TIMEOUT_S, "the kernel probe"
        )
        if why:
            return _lost(why)
        try:
            return tuple(_timings(k) for k in found), ""
        except (TypeError, KeyError, ValueError) as exc:  # not a list of timings
            return _lost(f"the kernel probe's answer could not be read: {exc!r}")


def measure(
    host: Host,
    *,
    model_path: Path | None,
    models_dir: Path,
    ask: Callable[[tuple[int, ...]], Ask],
    step: Callable[[str], None] = lambda _: None,
) -> Machine:
    """Every probe once, in order; `ask` makes the kernel probe's question for the thread
    counts to time; `step` is told each stage as it begins (the `plan_progress` steps
    `compute`, `storage`, `memory`)."""
    started = time.perf_counter()
    physical, logical = host.cores()
    step("compute")
    kernels, why = host.kernels(ask(candidates(physical)))
    step("storage")
    read = host.read_rate(model_path)
    disk = host.disk_free(models_dir)
    step("memory")
    total, available = host.memory()
    lock, lock_known = host.lock_limit()
    return Machine(
        physical_cores=physical,
        logical_cpus=logical,
        memory_total=total,
        memory_available=available,
        disk_free=disk,
        lock_limit=lock,
        lock_known=lock_known,
        read_rate=read,
        kernels=tuple(sorted(kernels, key=lambda k: k.threads)),
        kernels_why=why,
        seconds=time.perf_counter() - started,
    )


def _timings(found: dict[str, Any]) -> Kernels:
    return Kernels(
        threads=int(found["threads"]),
        token_rate=float(found["token_rate"]),
        layer_s=float(found["layer_s"]),
        prompt_flops=float(found["prompt_flops"]),
    )


def _lost(why: str) -> tuple[tuple[Kernels, ...], str]:
    log.warning("kernel probe: %s", why)
    return (), why


def _largest(path: Path) -> Path | None:
    if path.is_file():
        return path
    if path.is_dir():
        files = [p for p in path.iterdir() if p.is_file()]
        return max(files, key=lambda p: p.stat().st_size, default=None)
    return None


def cpu_name() -> str:
    """The host's processor as /proc/cpuinfo names it, else the platform's word."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine
