"""A probe: a named detector over one layer, a threshold, and the windows it scores.

The shape is the contract's (`ProbeInput` in spec/openapi/api.yaml; a file is
`mi.probe/v1`, spec/schemas/mi-probe-v1.json). `parse` checks what a schema
cannot say and names the field at fault; `Probe.view` is what `/api/probes`
answers. The digests (docs/DECISIONS.md, "Probes") pin what ran:

- `detector_digest`: SHA-256 of the detector's canonical JSON (kind, layer,
  link, bias, sae_id, features) followed by a linear weight's float32
  little-endian bytes: what is computed at each position.
- `decision_digest(window)`: SHA-256 of the canonical JSON of the detector
  digest, the window, the aggregate and the threshold: how a verdict follows.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOWS = ("last_user", "prompt", "completion")
AGGREGATES = ("mean", "max")
LINKS = ("identity", "sigmoid")
KINDS = ("linear", "sae_features")
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
RESERVED = frozenset({"import", "events", "score"})  # route segments under /api/probes
MAX_WIDTH = 65536
MAX_FEATURES = 4096
MAX_DESCRIPTION = 4096
FLOAT32_MAX = 3.4028234663852886e38  # a detector computes in float32


class ProbeError(ValueError):
    """A probe that cannot be defined as given (`param` names the field at fault)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True, kw_only=True)
class Detector:
    """What a probe computes at each position of layer `layer`, before its steering delta."""

    kind: str
    layer: int
    link: str = "identity"
    weight: tuple[float, ...] = ()  # linear
    bias: float = 0.0  # linear
    sae_id: str | None = None  # sae_features
    features: tuple[tuple[int, float], ...] = ()  # sae_features: (index, weight)

    @property
    def d_model(self) -> int | None:
        return len(self.weight) if self.kind == "linear" else None

    def digest(self) -> str:
        head = {
            "kind": self.kind,
            "layer": self.layer,
            "link": self.link,
            "bias": self.bias,
            "sae_id": self.sae_id,
            "features": [[i, w] for i, w in self.features],
        }
        sha = hashlib.sha256(_canonical(head))
        sha.update(struct.pack(f"<{len(self.weight)}f", *self.weight))
        return "sha256:" + sha.hexdigest()

    def view(self) -> dict[str, Any]:
        """The detector as `/api/probes` shows it: a linear weight by its width only."""
        if self.kind == "linear":
            return {"kind": self.kind, "layer": self.layer, "link": self.link, "bias": self.bias}
        return {
            "kind": self.kind,
            "layer": self.layer,
            "link": self.link,
            "sae_id": self.sae_id,
            "features": [{"index": i, "weight": w} for i, w in self.features],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    name: str
    detector: Detector
    threshold: float
    windows: tuple[str, ...]
    aggregate: str = "mean"
    description: str = ""
    model: str | None = None
    armed: bool = False
    created: float = 0.0
    updated: float = 0.0
    _digest: list[str] = field(default_factory=list, init=False, compare=False, repr=False)

    @property
    def detector_digest(self) -> str:
        if not self._digest:  # a frozen dataclass caches through a list
            self._digest.append(self.detector.digest())
        return self._digest[0]

    def decision_digest(self, window: str) -> str:
        body = {
            "detector_digest": self.detector_digest,
            "window": window,
            "aggregate": self.aggregate,
            "threshold": self.threshold,
        }
        return "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()

    def view(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "detector": self.detector.view(),
            "aggregate": self.aggregate,
            "threshold": self.threshold,
            "windows": list(self.windows),
            "model": self.model,
            "armed": self.armed,
            "detector_digest": self.detector_digest,
            "d_model": self.detector.d_model,
            "created": int(self.created),
            "updated": int(self.updated),
        }


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def check_name(name: str, param: str = "name") -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ProbeError(
            f"probe name {name!r} must be 1-64 of a-z 0-9 _ . - starting with a letter or digit",
            param,
        )
    if name in RESERVED:
        raise ProbeError(f"probe name {name!r} is taken by a route under /api/probes", param)
    return name


def _number(value: Any, param: str, *, float32: bool = False) -> float:
    """A finite number; `float32`: one a float32 holds (a detector's weight or bias)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProbeError(f"{param} must be a finite number, not {value!r}", param)
    if float32 and abs(float(value)) > FLOAT32_MAX:
        raise ProbeError(f"{param} {value!r} is past float32's range (±{FLOAT32_MAX:.4g})", param)
    return float(value)


def _choice(value: Any, allowed: Sequence[str], default: str, param: str) -> str:
    if value is None:
        return default
    if value not in allowed:
        raise ProbeError(f"{param} must be one of {', '.join(allowed)}, not {value!r}", param)
    return str(value)


def _absent(raw: Mapping[str, Any], keys: Sequence[str], kind: str) -> None:
    for key in keys:
        if raw.get(key) is not None:
            raise ProbeError(f"a {kind} detector takes no `{key}`", f"detector.{key}")


def weights(values: Any, param: str) -> tuple[float, ...]:
    """A linear detector's weight vector: 1..MAX_WIDTH finite numbers."""
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise ProbeError(f"{param} must be a non-empty list of numbers", param)
    if len(values) > MAX_WIDTH:
        raise ProbeError(f"{param} holds {len(values)} values; at most {MAX_WIDTH}", param)
    return tuple(_number(v, f"{param}[{i}]", float32=True) for i, v in enumerate(values))


def detector(raw: Any, *, weight: tuple[float, ...] | None = None) -> Detector:
    """A detector from its JSON (`weight` given: a sidecar's file already read)."""
    if not isinstance(raw, Mapping):
        raise ProbeError("detector must be an object", "detector")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ProbeError(f"detector.kind must be one of {', '.join(KINDS)}", "detector.kind")
    layer = raw.get("layer")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= 65535:
        raise ProbeError(
            f"detector.layer {layer!r} is not an integer in 0..65535", "detector.layer"
        )
    link = _choice(raw.get("link"), LINKS, "identity", "detector.link")
    if kind == "linear":
        _absent(raw, ("sae_id", "features"), kind)
        if weight is None:
            if raw.get("file") is not None:
                raise ProbeError(
                    "`file` is read from a sidecar only (POST /api/probes/import); send `weight`",
                    "detector.file",
                )
            weight = weights(raw.get("weight"), "detector.weight")
        bias = raw.get("bias")
        return Detector(
            kind=kind,
            layer=layer,
            link=link,
            weight=weight,
            bias=0.0 if bias is None else _number(bias, "detector.bias", float32=True),
        )
    _absent(raw, ("weight", "bias", "file"), kind)
    sae_id = raw.get("sae_id")
    if not isinstance(sae_id, str) or not sae_id:
        raise ProbeError("an sae_features detector names its SAE in `sae_id`", "detector.sae_id")
    return Detector(
        kind=kind, layer=layer, link=link, sae_id=sae_id, features=_features(raw.get("features"))
    )


def _features(raw: Any) -> tuple[tuple[int, float], ...]:
    param = "detector.features"
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ProbeError(f"{param} must be a non-empty list of {{index, weight}}", param)
    if len(raw) > MAX_FEATURES:
        raise ProbeError(f"{param} holds {len(raw)} features; at most {MAX_FEATURES}", param)
    pairs: list[tuple[int, float]] = []
    seen: set[int] = set()
    for j, item in enumerate(raw):
        where = f"{param}[{j}]"
        if not isinstance(item, Mapping):
            raise ProbeError(f"{where} must be an object {{index, weight}}", where)
        index = item.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**31:
            raise ProbeError(f"{where}.index {index!r} is not a feature index", f"{where}.index")
        if index in seen:
            raise ProbeError(f"feature {index} is listed twice", f"{where}.index")
        seen.add(index)
        pairs.append((index, _number(item.get("weight"), f"{where}.weight", float32=True)))
    return tuple(pairs)


def probe(raw: Mapping[str, Any], name: str, *, weight: tuple[float, ...] | None = None) -> Probe:
    """A probe from a `ProbeInput` (or a sidecar's `mi.probe/v1`) object, checked."""
    check_name(name)
    windows = raw.get("windows")
    if not isinstance(windows, Sequence) or isinstance(windows, str) or not windows:
        raise ProbeError(f"windows must list some of {', '.join(WINDOWS)}", "windows")
    for j, window in enumerate(windows):
        if window not in WINDOWS:
            raise ProbeError(f"windows[{j}] must be one of {', '.join(WINDOWS)}", f"windows[{j}]")
        if window in windows[:j]:
            raise ProbeError(f"window {window!r} is listed twice", f"windows[{j}]")
    description = raw.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise ProbeError(f"description must be text of at most {MAX_DESCRIPTION}", "description")
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ProbeError("model must name a model", "model")
    return Probe(
        name=name,
        detector=detector(raw.get("detector"), weight=weight),
        threshold=_number(raw.get("threshold"), "threshold"),
        windows=tuple(str(w) for w in windows),
        aggregate=_choice(raw.get("aggregate"), AGGREGATES, "mean", "aggregate"),
        description=description,
        model=model,
        armed=bool(raw.get("armed")),
    )
