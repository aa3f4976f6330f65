"""A probe as files: a `mi.probe/v1` JSON sidecar, and beside it a linear detector's weights.

`load(path)` reads the sidecar (spec/schemas/mi-probe-v1.json, checked with
jsonschema; `param` names the JSON pointer at fault), and for a linear
detector with `file` the safetensors file it names: a bare file name in the
sidecar's own folder, holding `weight` ([d_model]) and optionally `bias` (one
value). Nothing outside that folder is read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file

from .. import contract
from .definition import Probe, ProbeError, check_name, probe, weights

SCHEMA = "mi-probe-v1.json"
MAX_SIDECAR_BYTES = 16 * 1024 * 1024


def load(path: Path) -> Probe:
    """The probe a sidecar defines, its linear weights read from the file beside it."""
    if not path.is_absolute():
        raise ProbeError("path must be an absolute path to a .json sidecar", "path")
    try:
        if path.stat().st_size > MAX_SIDECAR_BYTES:
            raise ProbeError(f"{path} is over {MAX_SIDECAR_BYTES} bytes", "path")
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ProbeError(f"cannot read the sidecar {path}: {exc}", "path") from exc
    broken = contract.first_error(SCHEMA, raw)
    if broken is not None:
        field, message = broken
        raise ProbeError(f"{path}: {message}", field)
    name = check_name(raw["name"])
    spec = raw["detector"]
    weight = None
    if spec.get("kind") == "linear" and spec.get("file") is not None:
        weight, bias = _tensors(path, str(spec["file"]))
        if bias is not None and spec.get("bias") is None:
            raw = {**raw, "detector": {**spec, "bias": bias}}
    return probe(raw, name, weight=weight)


def _tensors(sidecar: Path, name: str) -> tuple[tuple[float, ...], float | None]:
    if Path(name).name != name or name in ("", ".", ".."):
        raise ProbeError(
            f"detector.file {name!r} must be a bare file name beside the sidecar",
            "detector.file",
        )
    file = sidecar.parent / name
    try:
        tensors = load_file(str(file))
    except (OSError, SafetensorError) as exc:
        raise ProbeError(f"cannot read {file}: {exc}", "detector.file") from exc
    if "weight" not in tensors or tensors["weight"].dim() != 1:
        raise ProbeError(f"{file} holds no 1-D tensor `weight`", "detector.file")
    weight = weights(tensors["weight"].float().tolist(), "detector.file")
    bias = None
    if "bias" in tensors:
        if tensors["bias"].numel() != 1:
            raise ProbeError(f"{file}: `bias` must hold one value", "detector.file")
        bias = float(tensors["bias"].float().reshape(()).item())
        if not math.isfinite(bias):
            raise ProbeError(f"{file}: `bias` is not finite", "detector.file")
    return weight, bias
