"""One request's view of steering, read by the forward hooks at every pass.

The hooks ask `vector(layer)` at every forward pass. The answer is the
request's own override while the steering epoch stays where it was when
the request started generating; once an operator changes steering, the
operator's state wins from the next pass on (OAI-CONC-01), and nothing is
restored over it at the end (OAI-CONC-02): the override only ever lived in
this object.

The source records the snapshot the hooks last applied, so the response
header states what ran (OAI-HDR-02), not what was asked, with `changed`
when the epoch moved (OAI-HDR-03), and X-miLLM-Circuit-Rung the evidence of
the circuits in it.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

import torch

from .applied import Snapshot
from .header import serialize
from .live import LiveSteering
from .rung import RequestState, rung_header


class RequestSource:
    """Steering for one request on `model_id`; hooks go on the attached layers."""

    def __init__(self, live: LiveSteering, model_id: str, override: Snapshot | None) -> None:
        self._live = live
        self._model_id = model_id
        self._override = override
        self._epoch = live.epoch
        self._layers = frozenset(a.layer for a in live.attachments(model_id))
        self._applied: Snapshot | None = None
        self._states = 0
        self._lock = threading.Lock()

    def current(self) -> Snapshot:
        """The state the next forward pass runs under."""
        epoch, snap = self._live.read(self._model_id)
        if self._override is not None and epoch == self._epoch:
            return self._override
        return snap

    def layers(self) -> frozenset[int]:
        """Layers to hook: every attached layer, so an operator's change reaches this request."""
        return self._layers

    def vector(self, layer: int) -> torch.Tensor | None:
        """The vector to add at `layer` in this pass (None: nothing), recorded as applied."""
        snap = self.current()
        if snap is not self._applied:
            with self._lock:
                self._applied = snap
                self._states += 1
        return snap.vectors.get(layer)

    def key(self) -> Hashable:
        """The state a kept KV prefix is filled under (the engine keys its prefix by it)."""
        return self.current().key

    def mixed(self) -> bool:
        """Whether the hooks served more than one state (a kept KV prefix would mix them)."""
        return self._states > 1

    def changed(self) -> bool:
        return self._live.epoch != self._epoch

    def header(self) -> str:
        """X-miLLM-Steering: what the hooks applied last, `changed` if the epoch moved."""
        return serialize(self._last().members(self._layers), changed=self.changed())

    def rung(self) -> str | None:
        """X-miLLM-Circuit-Rung for what the hooks applied last, or None where OAI-RUNG-09..17
        omit it: no `circuit` member in X-miLLM-Steering means no rung."""
        return rung_header(self._last().circuits(self._layers), RequestState())

    def _last(self) -> Snapshot:
        return self._applied if self._applied is not None else self.current()


class FixedSource:
    """One snapshot, hooked at its own layers: for benchmarks and engine-level tests."""

    def __init__(self, snap: Snapshot) -> None:
        self.snapshot = snap

    def layers(self) -> frozenset[int]:
        return self.snapshot.layers()

    def vector(self, layer: int) -> torch.Tensor | None:
        return self.snapshot.vectors.get(layer)

    def key(self) -> Hashable:
        return self.snapshot.key

    def mixed(self) -> bool:
        return False
