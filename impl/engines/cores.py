"""How many threads a forward pass should use: the physical cores this process may use.

A core's hyperthreads share its vector units, so, as llama.cpp's own
default does, one thread per physical core is counted (CPUs with the same
package and core id are one core). Unlike llama.cpp's default, only the
CPUs this process may run on count (its affinity: `taskset`, a cpuset), and
a CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`, on the process's
cgroup and each one above it) caps the count at the quota rounded up: more
threads than the quota allows would be throttled in turn, and a thread that
waits stalls every other at the next barrier of a forward pass.

The readers are parameters so that tests can fake a host; a file that cannot
be read counts as absent (no topology: every allowed CPU is a core; no quota:
no cap).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

Read = Callable[[str], str | None]

SYS_CPU = "/sys/devices/system/cpu"
CGROUP_ROOT = "/sys/fs/cgroup"


def read_file(path: str) -> str | None:
    """The text of the file at `path`, or None when it cannot be read."""
    try:
        return Path(path).read_text()
    except (OSError, ValueError):
        return None


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cores(
    affinity: Callable[[], Iterable[int]] = allowed_cpus, read: Read = read_file
) -> int:
    """The physical cores among the allowed CPUs, capped by the CPU quota; at least 1."""
    cpus = set(affinity())
    cores = physical_cores(cpus, read) if cpus else 1
    quota = cpu_quota(read)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def physical_cores(cpus: Iterable[int], read: Read) -> int:
    """How many distinct (package, core) pairs `cpus` sit on; a CPU whose topology is
    unreadable counts as a core of its own."""
    seen: set[tuple[str, str] | int] = set()
    for cpu in cpus:
        topology = f"{SYS_CPU}/cpu{cpu}/topology"
        package, core = read(f"{topology}/physical_package_id"), read(f"{topology}/core_id")
        seen.add(cpu if package is None or core is None else (package.strip(), core.strip()))
    return len(seen)


def cpu_quota(read: Read) -> float | None:
    """The CPUs' worth of time the process's cgroups allow (the tightest of the process's
    cgroup and those above it), or None when there is no quota."""
    table = read("/proc/self/cgroup")
    if table is None:
        return None
    quotas = []
    for line in table.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # cgroup v2: one unified hierarchy
            quotas += [_v2(read(f"{d}/cpu.max")) for d in _upward(CGROUP_ROOT, path)]
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's hierarchy
            root = f"{CGROUP_ROOT}/{controllers}"
            quotas += [
                _v1(read(f"{d}/cpu.cfs_quota_us"), read(f"{d}/cpu.cfs_period_us"))
                for d in _upward(root, path)
            ]
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _upward(root: str, path: str) -> list[str]:
    """The cgroup folder at `path` under `root`, then each folder above it up to `root`."""
    parts = [p for p in path.strip().split("/") if p]
    return [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]


def _v2(text: str | None) -> float | None:
    """`cpu.max` ("<quota> <period>", quota "max" for none) as CPUs."""
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1(quota: str | None, period: str | None) -> float | None:
    """`cpu.cfs_quota_us` (-1 for none) over `cpu.cfs_period_us`, as CPUs."""
    if quota is None or period is None:
        return None
    return _ratio(quota.strip(), period.strip())


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None
