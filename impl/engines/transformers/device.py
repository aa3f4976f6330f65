"""Where a transformers model runs, and in which floating-point type (issue 48).

`placement(device, dtype, stored)` turns the session's `device` (`auto`, `cpu`, `cuda`,
`cuda:N`) and `dtype` (`auto`, `float32`, `bfloat16`, `float16`) into a torch device and
type before anything is loaded:

- `auto` is the first CUDA device torch sees, else the CPU;
- a CUDA device this process cannot see is refused (`DeviceUnavailable`, naming it);
  bfloat16 on a card that cannot compute in it is float16;
- dtype `auto` is float32 on the CPU (its fast path, and the reference the device check
  compares against); on a GPU it is the checkpoint's own half type (`stored`), else
  bfloat16 where the card computes in it, else float16.

Everything the engine makes per pass (ids, masks, positions, steering deltas, probe
weights) is made on the model's device; only what the wire needs (token ids, the logits
a sampler reads, log-probabilities, readings) is copied to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICES = ("auto", "cpu", "cuda")  # and cuda:N
HALF = (torch.bfloat16, torch.float16)


class DeviceUnavailable(ValueError):
    """The session asks for a device or a type this process cannot use."""


@dataclass(frozen=True, slots=True)
class Placement:
    device: torch.device
    dtype: torch.dtype

    @property
    def name(self) -> str:
        """`cpu`, or `cuda:N`."""
        return str(self.device)


def resolve_device(wanted: str) -> torch.device:
    """The torch device `wanted` names (`auto`: the first CUDA device, else the CPU)."""
    if wanted == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if wanted == "cpu":
        return torch.device("cpu")
    if wanted == "cuda" or wanted.startswith("cuda:"):
        index = 0 if wanted == "cuda" else _index(wanted)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            seen = f"{count} CUDA device(s)" if count else "no CUDA device (a CPU build of torch)"
            raise DeviceUnavailable(f"device {wanted} is not available: this process sees {seen}")
        return torch.device("cuda", index)
    raise DeviceUnavailable(f"device {wanted!r} is none of auto, cpu, cuda, cuda:N")


def _index(wanted: str) -> int:
    tail = wanted.removeprefix("cuda:")
    if not tail.isdigit():
        raise DeviceUnavailable(f"device {wanted!r} is none of auto, cpu, cuda, cuda:N")
    return int(tail)


def resolve_dtype(wanted: str, device: torch.device, stored: torch.dtype | None) -> torch.dtype:
    """The type to compute in on `device` (`stored`: the checkpoint's, when it says)."""
    if wanted != "auto":
        dtype: torch.dtype = getattr(torch, wanted)
        if device.type == "cuda" and dtype == torch.bfloat16 and not _bf16(device):
            return torch.float16
        return dtype
    if device.type != "cuda":
        return torch.float32
    if stored in HALF and (stored != torch.bfloat16 or _bf16(device)):
        return stored
    return torch.bfloat16 if _bf16(device) else torch.float16


def _bf16(device: torch.device) -> bool:
    with torch.cuda.device(device):
        return bool(torch.cuda.is_bf16_supported())


def describe(device: torch.device) -> str:
    """The device in words, for messages: `the CPU`, `cuda:0 (NVIDIA H100 80GB HBM3)`."""
    if device.type != "cuda":
        return "the CPU"
    return f"{device} ({torch.cuda.get_device_name(device)})"
