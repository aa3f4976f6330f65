"""This machine as the planner measures it (REQ-003 PLAN-04, -05, -10, -31, LOAD-11).

The probes are quick and harmless: the cores this process may use
(engines/cores.py), memory (psutil), the models folder's free disk, the lock
ceiling (RLIMIT_MEMLOCK), a sequential read of the model file (at most
READ_S seconds), a memory-copy run, and float32 matmuls at the model's width:
prompt-wide (PROMPT_ROWS rows) and one token's. None allocates until failure
and none loads the model; together they take about two seconds.

`Host` is the real machine; tests give `measure` a host of their own (8
cores, 2 GB free). Devices beyond the host are asked by planner/devices.py.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from ..engines import cores
from ..models import inspection

READ_S = 1.0  # the model file's sequential read, at most
READ_CHUNK = 8 << 20
COPY_BYTES = 64 << 20  # the memory-copy run's buffer (each way)
RUN_S = 0.25  # each timed kernel repeats for about this long
PROMPT_ROWS = 256  # a prompt-wide matmul's rows (tokens)


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
    copy_rate: float  # memory bandwidth (bytes read + written)
    prompt_flops: float  # float32 matmul, PROMPT_ROWS rows at the model's width
    token_flops: float  # float32 matrix-vector product at the model's width
    seconds: float  # what the probes took


class Host:
    """The probes of the real machine."""

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

    def copy_rate(self, threads: int) -> float:
        with _threads(threads):
            source = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
            target = torch.empty_like(source)
            seconds = _best(lambda: target.copy_(source))
        return 2 * COPY_BYTES / seconds

    def matmul(self, width: int, threads: int) -> tuple[float, float]:
        """FLOP/s of a prompt-wide matmul and of one token's, float32, at `width`."""
        width = max(64, min(width, 8192))
        with _threads(threads), torch.inference_mode():
            weight = torch.randn(width, width, dtype=torch.float32)
            prompt = torch.randn(PROMPT_ROWS, width, dtype=torch.float32)
            token = torch.randn(1, width, dtype=torch.float32)
            prompt_s = _best(lambda: prompt @ weight)
            token_s = _best(lambda: token @ weight)
        return 2 * PROMPT_ROWS * width * width / prompt_s, 2 * width * width / token_s


def measure(
    host: Host,
    *,
    model_path: Path | None,
    models_dir: Path,
    width: int,
    step: Callable[[str], None] = lambda _: None,
) -> Machine:
    """Every probe once, in order; `step` is told each stage as it begins (the
    `plan_progress` steps `compute`, `storage`, `memory`)."""
    started = time.perf_counter()
    physical, logical = host.cores()
    step("compute")
    prompt_flops, token_flops = host.matmul(width, physical)
    step("storage")
    read = host.read_rate(model_path)
    disk = host.disk_free(models_dir)
    step("memory")
    copy = host.copy_rate(physical)
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
        copy_rate=copy,
        prompt_flops=prompt_flops,
        token_flops=token_flops,
        seconds=time.perf_counter() - started,
    )


def _largest(path: Path) -> Path | None:
    if path.is_file():
        return path
    if path.is_dir():
        files = [p for p in path.iterdir() if p.is_file()]
        return max(files, key=lambda p: p.stat().st_size, default=None)
    return None


def _best(kernel: Callable[[], object]) -> float:
    """The fastest of the runs of `kernel` made in about RUN_S (one warm-up first)."""
    kernel()
    best = float("inf")
    started = time.perf_counter()
    while True:
        began = time.perf_counter()
        kernel()
        best = min(best, time.perf_counter() - began)
        if time.perf_counter() - started >= RUN_S:
            return max(best, 1e-9)


class _threads:
    """torch's intra-op threads set for a probe, and put back after."""

    def __init__(self, count: int) -> None:
        self._count = max(1, count)
        self._before = 0

    def __enter__(self) -> None:
        self._before = torch.get_num_threads()
        torch.set_num_threads(self._count)

    def __exit__(self, *_: object) -> None:
        torch.set_num_threads(self._before)


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
