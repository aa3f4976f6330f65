"""The default thread count: the physical cores this process may use (issue 23 item 1).

Each host is faked: an affinity mask and a file tree (sysfs topology, /proc/self/cgroup,
the cgroup's quota files). LOC-INFO-17 reports the count the engine then uses.
"""

from __future__ import annotations

import os

import pytest

from miserver.engines.cores import cpu_quota, usable_cores


def host(
    cores: int,
    *,
    smt: int = 1,
    cgroup: str = "0::/\n",
    files: dict[str, str] | None = None,
) -> tuple[set[int], dict[str, str]]:
    """CPUs 0..cores*smt-1, `smt` hyperthreads per core (siblings numbered core + k*cores,
    as Linux numbers them), one package."""
    tree = {"/proc/self/cgroup": cgroup}
    for cpu in range(cores * smt):
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        tree[f"{topology}/physical_package_id"] = "0\n"
        tree[f"{topology}/core_id"] = f"{cpu % cores}\n"
    tree.update(files or {})
    return set(range(cores * smt)), tree


def count(cpus: set[int], tree: dict[str, str]) -> int:
    return usable_cores(affinity=lambda: cpus, read=tree.get)


@pytest.mark.parametrize("cores", [1, 2, 8], ids=["1-core", "2-cores", "8-cores"])
def test_every_allowed_core_no_quota(cores: int) -> None:
    """LOC-INFO-17: with no affinity limit and no quota, one thread per physical core."""
    assert count(*host(cores)) == cores


@pytest.mark.parametrize("cores", [1, 2, 8], ids=["1-core", "2-cores", "8-cores"])
def test_hyperthreads_count_once(cores: int) -> None:
    """LOC-INFO-17: two hyperthreads of one core are one thread, as llama.cpp counts."""
    assert count(*host(cores, smt=2)) == cores


@pytest.mark.parametrize("allowed", [1, 2, 8], ids=["1-core", "2-cores", "8-cores"])
def test_affinity_limits_the_count(allowed: int) -> None:
    """LOC-INFO-17: a process pinned (taskset, cpuset) to `allowed` of 16 cores uses those."""
    _, tree = host(16)
    assert count(set(range(allowed)), tree) == allowed


def test_affinity_on_siblings_of_one_core() -> None:
    """LOC-INFO-17: pinned to both hyperthreads of core 3 (CPUs 3 and 11 of 8x2): one core."""
    _, tree = host(8, smt=2)
    assert count({3, 11}, tree) == 1


@pytest.mark.parametrize(
    ("quota", "expected"),
    [("100000 100000", 1), ("200000 100000", 2), ("800000 100000", 8), ("150000 100000", 2)],
    ids=["1-core", "2-cores", "8-cores", "1.5-rounds-up"],
)
def test_cgroup_v2_quota_caps_the_count(quota: str, expected: int) -> None:
    """LOC-INFO-17: a cgroup v2 cpu.max quota on a 16-core host caps the count."""
    cpus, tree = host(
        16,
        cgroup="0::/app/worker\n",
        files={"/sys/fs/cgroup/app/worker/cpu.max": f"{quota}\n"},
    )
    assert count(cpus, tree) == expected


def test_cgroup_v2_parent_quota_counts() -> None:
    """A quota set on a parent cgroup binds its children: the tightest one wins."""
    cpus, tree = host(
        16,
        cgroup="0::/app/worker\n",
        files={
            "/sys/fs/cgroup/app/worker/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/app/cpu.max": "200000 100000\n",
            "/sys/fs/cgroup/cpu.max": "800000 100000\n",
        },
    )
    assert count(cpus, tree) == 2


@pytest.mark.parametrize(
    ("quota", "expected"),
    [("100000", 1), ("200000", 2), ("800000", 8), ("-1", 16)],
    ids=["1-core", "2-cores", "8-cores", "no-quota"],
)
def test_cgroup_v1_quota_caps_the_count(quota: str, expected: int) -> None:
    """LOC-INFO-17: a cgroup v1 cfs quota (seen at the container's root, as a container
    without its own cgroup namespace sees it) caps the count; -1 is no quota."""
    cpus, tree = host(
        16,
        cgroup="4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
        files={
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": f"{quota}\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert count(cpus, tree) == expected


def test_quota_and_affinity_take_the_smaller() -> None:
    """Pinned to 8 cores with a 2-CPU quota: 2; pinned to 1 core with a 4-CPU quota: 1."""
    _, tree = host(16, files={"/sys/fs/cgroup/cpu.max": "200000 100000"})
    assert count(set(range(8)), tree) == 2
    _, tree = host(16, files={"/sys/fs/cgroup/cpu.max": "400000 100000"})
    assert count({5}, tree) == 1


def test_unreadable_host_falls_back_to_allowed_cpus() -> None:
    """No topology and no /proc/self/cgroup: every allowed CPU is a core, no cap."""
    assert usable_cores(affinity=lambda: {0, 1, 2}, read=lambda path: None) == 3
    assert cpu_quota(lambda path: None) is None


def test_this_host() -> None:
    """LOC-INFO-17: on the machine running the suite, a count between 1 and its CPUs."""
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
