"""The armed probes of one request, made concrete against the model that serves it.

`Watch.fit` turns each probe's detector into the engine's `Detector`
(engines/monitor.py), or the reason it cannot run there (`skipped`). Each
choice gets a fresh `Monitor`; once it ends, `results` reads every window of
every probe off it and shapes the `mi.probe.result/v1` objects (v1.yaml
`ProbeResult`; REQ-000 open point 4).

Windows, over the positions the model computed (prompt, then each generated
token fed back; the last one picked never is):

    last_user    the last user message's content in the render served (tools shown);
                 the whole prompt on /v1/completions, where the prompt is the user's
    prompt       every prompt position
    completion   every generated token fed back

A window's per-position values are aggregated (mean or max), the probe's link
applied (identity or sigmoid), and the verdict is `flagged` when the score
reaches the threshold. A window with no position is `skipped`
(`empty_window`); a choice that ended early scores what ran, `interrupted`.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..engines.base import Capability, Engine
from ..engines.monitor import Detector, Monitor
from ..steering.live import LiveSteering
from ..steering.sae import SAE, placed
from .definition import Probe

SCHEMA = "mi.probe.result/v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """How the request was served (a result's `served`)."""

    backend: str  # serial, batch, score
    engine: str  # transformers, llama.cpp
    model: str

    def view(self) -> dict[str, str]:
        return {"backend": self.backend, "engine": self.engine, "model": self.model}


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The model a watch is fitted to: its id, width, depth, and what it can do."""

    model: str
    engine: str
    d_model: int
    n_layers: int
    monitoring: bool
    attachments: Sequence[tuple[str, int, SAE]] = ()  # (sae_id, layer, SAE)


def shape(engine: Engine, model: str, live: LiveSteering) -> Shape:
    """The model a request's probes are fitted to: its width, depth, whether its engine
    monitors, and the SAEs attached to it (for SAE-feature detectors)."""
    facts = engine.facts
    steering = Capability.STEERING in engine.capabilities
    attached = live.attachments(model) if steering else []
    return Shape(
        model=model,
        engine=facts.engine,
        d_model=facts.d_model,
        n_layers=facts.n_layers,
        monitoring=Capability.MONITORING in engine.capabilities,
        attachments=[(a.sae.sae_id, a.layer, a.sae) for a in attached],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Windows:
    """A choice's positions: the prompt's length, the generated tokens fed back, and the
    last user message's span (None: no user text)."""

    prompt: int
    fed: int
    user: tuple[int, int] | None

    def span(self, window: str) -> tuple[int, int] | None:
        if window == "prompt":
            return (0, self.prompt)
        if window == "completion":
            return (self.prompt, self.prompt + self.fed)
        return self.user


def _linear(probe: Probe) -> Any:
    weight = OnDevice(torch.tensor(probe.detector.weight, dtype=torch.float32))
    bias = probe.detector.bias

    def values(rows: torch.Tensor) -> torch.Tensor:
        return (rows.float() @ weight.on(rows.device) + bias).cpu()

    return values


def _features(probe: Probe, sae: SAE) -> Any:
    index = OnDevice(torch.tensor([i for i, _ in probe.detector.features], dtype=torch.long))
    weight = OnDevice(torch.tensor([w for _, w in probe.detector.features], dtype=torch.float32))

    def values(rows: torch.Tensor) -> torch.Tensor:
        device = rows.device
        acts = placed(sae, device).encode(rows)[:, index.on(device)]
        return (acts.float() @ weight.on(device)).cpu()

    return values


class OnDevice:
    """A probe's tensor, copied once to each device its rows come from (the model's)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._by_device = {tensor.device: tensor}

    def on(self, device: torch.device) -> torch.Tensor:
        found = self._by_device.get(device)
        if found is None:
            found = self._by_device[device] = next(iter(self._by_device.values())).to(device)
        return found


def _sae(probe: Probe, shape: Shape) -> SAE | None:
    for sae_id, layer, sae in shape.attachments:
        if sae_id == probe.detector.sae_id and layer == probe.detector.layer:
            return sae
    return None


def _detector_of(probe: Probe, shape: Shape) -> Detector | str:
    """The engine detector of `probe` on this model, or why it is skipped."""
    det = probe.detector
    if probe.model is not None and probe.model != shape.model:
        return "model_mismatch"
    if not shape.monitoring:
        return "engine_unsupported"
    if det.layer >= shape.n_layers:
        return "layer_out_of_range"
    if det.kind == "linear":
        if len(det.weight) != shape.d_model:
            return "model_mismatch"
        return Detector(layer=det.layer, values=_linear(probe))
    sae = _sae(probe, shape)
    if sae is None:
        return "sae_not_attached"
    if any(i >= sae.d_sae for i, _ in det.features):
        return "feature_out_of_range"
    return Detector(layer=det.layer, values=_features(probe, sae))


def _score(probe: Probe, values: Sequence[float]) -> float:
    if not all(math.isfinite(v) for v in values):
        return math.nan
    raw = max(values) if probe.aggregate == "max" else math.fsum(values) / len(values)
    if probe.detector.link == "sigmoid":
        return 1.0 / (1.0 + math.exp(-raw)) if raw >= 0 else math.exp(raw) / (1.0 + math.exp(raw))
    return raw


class Watch:
    """What a request's armed probes read, and how their results are shaped."""

    def __init__(self, probes: Sequence[Probe], trace_id: str) -> None:
        self.probes = tuple(probes)
        self.trace_id = trace_id
        self._fitted: list[Detector | str] = []

    def fit(self, shape: Shape) -> None:
        """Fix each probe's detector against the model (again after a reload)."""
        self._fitted = [_detector_of(p, shape) for p in self.probes]

    @property
    def reads(self) -> bool:
        """Whether some probe runs on this model (else no monitor is needed)."""
        return any(isinstance(fitted, Detector) for fitted in self._fitted)

    @property
    def needs_user(self) -> bool:
        """Whether some running probe reads `last_user`."""
        return any(
            isinstance(fitted, Detector) and "last_user" in p.windows
            for p, fitted in zip(self.probes, self._fitted, strict=True)
        )

    def monitor(self) -> Monitor | None:
        """A fresh monitor for one choice (None when no probe runs here)."""
        detectors = [fitted for fitted in self._fitted if isinstance(fitted, Detector)]
        return Monitor(detectors) if detectors else None

    def results(
        self,
        monitor: Monitor | None,
        windows: Windows,
        *,
        index: int,
        served: Served,
        request_id: str,
        interrupted: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every (probe, window) result of one choice; `interrupted`: the reason it ended
        early (`client_disconnected`, `generation_failed`)."""
        out = []
        running = 0  # the monitor's detectors are the running plans, in order
        now = int(time.time())
        for p, fitted in zip(self.probes, self._fitted, strict=True):
            values: list[float] | None = None
            if isinstance(fitted, Detector) and monitor is not None:
                values = monitor.values(running)
                running += 1
            for window in p.windows:
                result = self._result(p, window, index, served, request_id, now)
                if values is None:
                    assert isinstance(fitted, str)
                    result.update(outcome="skipped", reason=fitted)
                else:
                    span = windows.span(window)
                    picked = [] if span is None else values[span[0] : span[1]]
                    self._read(result, p, picked, interrupted)
                out.append(result)
        return out

    def _result(
        self, p: Probe, window: str, index: int, served: Served, request_id: str, now: int
    ) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "result_id": "pr_" + uuid.uuid4().hex,
            "probe": p.name,
            "name": p.name,
            "window": window,
            "index": index,
            "outcome": "skipped",
            "reason": "empty_window",
            "verdict": "none",
            "score": None,
            "scored": False,
            "threshold": p.threshold,
            "tokens": 0,
            "layer": p.detector.layer,
            "detector_digest": p.detector_digest,
            "decision_digest": p.decision_digest(window),
            "served": served.view(),
            "trace_id": self.trace_id,
            "request_id": request_id,
            "created": now,
        }

    @staticmethod
    def _read(
        result: dict[str, Any], p: Probe, values: Sequence[float], interrupted: str | None
    ) -> None:
        result["tokens"] = len(values)
        if interrupted is not None:
            result.update(outcome="interrupted", reason=interrupted)
        if not values:
            if interrupted is None:
                result.update(outcome="skipped", reason="empty_window")
            return
        score = _score(p, values)
        if not math.isfinite(score):  # the detector overflowed float32: no score to give
            if interrupted is None:
                result.update(outcome="skipped", reason="non_finite_score")
            return
        flagged = score >= p.threshold
        result.update(score=score, scored=True, verdict="flagged" if flagged else "clear")
        if interrupted is None:
            result.update(
                outcome="scored", reason="above_threshold" if flagged else "below_threshold"
            )
