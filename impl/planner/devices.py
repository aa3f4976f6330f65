"""Compute devices beyond the host (REQ-003 PLAN-07, -08, -35..41).

A backend that could offer a local device is a CUDA or MPS build of torch, or
a llama.cpp built with GPU offload; a remote backend or a BLAS library the
host calls into is not one. With none, there is nothing to ask
(`devices_none: "build"`). Otherwise the devices are asked in a process of
their own, `miserver serve --probe-device` (its JSON on stdout, within
DEVICE_TIMEOUT_S), so a driver that ends its process marks the device
`unusable` instead of ending the server; `--no-isolated-probes` asks in
process. An answer with no device reads `machine`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import child

log = logging.getLogger(__name__)

DEVICE_TIMEOUT_S = 30.0
RATIO_WIDTH = 1024  # the square matmul a device is timed on against the host
NONE_TEXT = {
    "build": "This build has no backend that could offer a GPU (torch without CUDA or MPS, "
    "llama.cpp without GPU offload).",
    "machine": "This build could use a GPU, but this machine gave it none.",
    "not_probed": "Devices beyond the host were not probed.",
    "": "",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """A device beyond the host, as its probe found it."""

    name: str
    description: str
    memory_total: int
    prompt_ratio: float  # its matmul rate against the host's; 0 when unmeasured
    token_ratio: float
    status: str  # usable until placed: used | unused | refused | unusable
    why: str


@dataclass(frozen=True, slots=True)
class Devices:
    found: tuple[Device, ...]
    none: str  # build | machine | not_probed | "" (LOC-PLAN-39)

    @property
    def usable(self) -> tuple[Device, ...]:
        return tuple(d for d in self.found if d.status not in ("unusable", "refused"))


def backends() -> list[str]:
    """The backends this build has that could offer a local device (LOC-PLAN-41)."""
    found = []
    if torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        found.append("cuda")
    if torch.backends.mps.is_built():
        found.append("mps")
    try:
        import llama_cpp

        if llama_cpp.llama_supports_gpu_offload():
            found.append("llama.cpp")
    except (ImportError, AttributeError, OSError):
        pass
    return found


def report() -> list[dict[str, Any]]:
    """The devices torch sees, each timed against the host on one matmul (in this process:
    the child of `--probe-device`, or the server with `--no-isolated-probes`)."""
    found: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        host = _rate("cpu")
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            rate = _rate(f"cuda:{index}")
            found.append(
                {
                    "name": f"cuda:{index}",
                    "description": props.name,
                    "memory_total": int(props.total_memory),
                    "ratio": rate / host if host else 0.0,
                }
            )
    return found


CHILD = (sys.executable, "-m", "miserver.cli", "serve", "--probe-device")


def probe(
    *,
    isolated: bool = True,
    timeout_s: float = DEVICE_TIMEOUT_S,
    command: Sequence[str] = CHILD,
) -> Devices:
    """The devices beyond the host, asked by `command` (the server started again with
    `--probe-device`) unless `isolated` is off; never raises for a device's fault."""
    if not backends():
        return Devices((), "build")
    if not isolated:
        return _devices(report())
    found, why = child.answer(command, timeout_s, "the device probe")
    return _lost(why) if why else _devices(found)


def _devices(answer: list[dict[str, Any]]) -> Devices:
    found = tuple(
        Device(
            name=str(d["name"]),
            description=str(d["description"]),
            memory_total=int(d["memory_total"]),
            prompt_ratio=float(d["ratio"]),
            token_ratio=float(d["ratio"]),
            status="unused",
            why="",
        )
        for d in answer
    )
    return Devices(found, "" if found else "machine")


def _lost(why: str) -> Devices:
    log.warning("device probe: %s", why)
    device = Device(
        name="gpu",
        description="a device the probe could not read",
        memory_total=0,
        prompt_ratio=0.0,
        token_ratio=0.0,
        status="unusable",
        why=why,
    )
    return Devices((device,), "")


def _rate(device: str) -> float:
    """Matmuls a second of RATIO_WIDTH squares on `device`, the best of a few."""
    a = torch.randn(RATIO_WIDTH, RATIO_WIDTH, device=device)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        (a @ a).sum().item()
        best = min(best, time.perf_counter() - started)
    return 1.0 / best if best > 0 else 0.0
