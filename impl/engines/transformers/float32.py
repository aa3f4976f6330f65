"""Float32 scoring (OAI-F32): a float32 copy of the served model, for one request.

The served weights are never cast or changed: a model already in float32 is
scored as it is (F32-07); any other is copied, cast to float32 on the chosen
device, used for the request's forward passes, and released. At most one
copy exists at a time. What cannot be served is refused with a reason:

    model_not_float32_castable   quantized, integer parameters, or not copyable
    memory                       4 bytes per parameter plus the headroom do not fit,
                                 or allocating / running the copy ran out of memory
    device                       SCORING_FLOAT32_DEVICE names a GPU this server cannot
                                 see, or `cuda` while the model is on the CPU
    busy                         another request's copy is in use
"""

from __future__ import annotations

import copy
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..base import PrecisionUnavailable

log = logging.getLogger(__name__)

MIB = 1 << 20
BYTES_PER_PARAMETER = 4


@dataclass(frozen=True, slots=True)
class Float32Settings:
    device: str = "auto"  # auto, cpu, cuda (or cuda:N)
    headroom_mib: int = 512
    available_mib: Callable[[], int] | None = None  # host memory the server may use


def _castable(model: PreTrainedModel) -> None:
    quantized = getattr(model, "hf_quantizer", None) is not None or getattr(
        model.config, "quantization_config", None
    )
    if quantized:
        raise PrecisionUnavailable(
            "model_not_float32_castable", "the model is quantized; it has no float32 form"
        )
    if any(not p.is_floating_point() for p in model.parameters()):
        raise PrecisionUnavailable("model_not_float32_castable", "the model has integer parameters")


def is_float32(model: PreTrainedModel) -> bool:
    return all(p.dtype == torch.float32 for p in model.parameters())


class Float32Copies:
    """Makes (one at a time) the float32 copy a request scores on."""

    def __init__(self, settings: Float32Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()

    def _target(self, served: torch.device) -> torch.device:
        wanted = self._settings.device
        if wanted == "cpu":
            return torch.device("cpu")
        if wanted.startswith("cuda"):
            if served.type != "cuda":
                raise PrecisionUnavailable(
                    "device", f"SCORING_FLOAT32_DEVICE is {wanted} but the model is on the CPU"
                )
            if not torch.cuda.is_available():
                raise PrecisionUnavailable("device", f"this server cannot see {wanted}")
            return torch.device(wanted)
        return served  # auto: the model's own device (the CPU here)

    def _check_fit(self, parameters: int, device: torch.device) -> None:
        need = -(-parameters * BYTES_PER_PARAMETER // MIB) + self._settings.headroom_mib
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0] // MIB
        elif self._settings.available_mib is not None:
            free = self._settings.available_mib()
        else:
            return
        if need > free:
            raise PrecisionUnavailable(
                "memory",
                f"a float32 copy needs {need} MiB with the headroom; {free} MiB are available",
            )

    @contextmanager
    def model(self, served: PreTrainedModel) -> Iterator[PreTrainedModel]:
        """The float32 model to score on: `served` itself if it is float32, else a copy."""
        if is_float32(served):
            yield served
            return
        _castable(served)
        device = self._target(next(served.parameters()).device)
        self._check_fit(sum(p.numel() for p in served.parameters()), device)
        if not self._lock.acquire(blocking=False):
            raise PrecisionUnavailable(
                "busy", "another request's float32 copy is in use; retry when it finishes"
            )
        try:
            try:
                twin: PreTrainedModel = copy.deepcopy(served)
                twin.to(device=device, dtype=torch.float32)  # type: ignore[call-arg]
            except (MemoryError, torch.OutOfMemoryError) as exc:
                raise PrecisionUnavailable("memory", f"allocating the copy failed: {exc}") from exc
            except (TypeError, RuntimeError) as exc:
                raise PrecisionUnavailable(
                    "model_not_float32_castable", f"the model cannot be copied: {exc}"
                ) from exc
            try:
                yield twin
            except (MemoryError, torch.OutOfMemoryError) as exc:
                raise PrecisionUnavailable("memory", f"the float32 pass ran out: {exc}") from exc
            finally:
                del twin
                gc.collect()
        finally:
            self._lock.release()
