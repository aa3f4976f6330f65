"""Running out of memory in a forward pass, told apart from every other failure (issue 48).

A generation, a scoring pass or an embedding that runs its device out of memory is the
seed's typed refusal (`503 insufficient_memory`, OAI-ERR-28/29, OAI-SCORE-31), not a
server fault: `ran_out(exc)` names the card (or the host) when `exc` is such a failure,
and the error layer answers with it (errors.fault).
"""

from __future__ import annotations

import re

import torch

_CARD = re.compile(r"\bGPU (\d+)\b")


def ran_out(exc: BaseException) -> str | None:
    """The device `exc` ran out of memory on, in words; None when it is another failure."""
    if isinstance(exc, torch.OutOfMemoryError):
        return _card(str(exc))
    if isinstance(exc, MemoryError):
        return "the host"
    return None


def _card(message: str) -> str:
    """`cuda:N (its name)` from torch's message, else the current CUDA device's."""
    found = _CARD.search(message)
    if not torch.cuda.is_available():
        return f"GPU {found.group(1)}" if found else "the GPU"
    index = int(found.group(1)) if found else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
