"""What probes read while a choice runs (REQ-000 PROBE): per-position detector values.

A `Detector` turns one layer's residual rows into one value per position; a
`Monitor` holds a choice's detectors and the values they gave, in the order
the positions ran. An engine with the `monitoring` capability feeds it from a
hook on each detector's layer, ahead of that layer's steering hook (probes
read `pre_steering`), on the serial path (`Engine.monitoring`) and per row of
its batch (`Batch.join(monitor=...)`). A monitored choice reuses no kept KV
prefix, so its values cover every prompt position, then every generated token
fed back (the last one picked never is).

The detectors' arithmetic is the caller's (a probe knows its weights); this
module only keeps the values. Values are appended from the engine's worker
thread; `values()` may be read from another thread while a choice still runs
(an interrupted stream's results): it reads a copy of the parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, eq=False, kw_only=True)
class Detector:
    """One probe's reading of layer `layer`: `values(rows)` maps residual rows
    [positions, width] (float32, on the CPU or the model's device) to [positions]."""

    layer: int
    values: Callable[[Any], Any]


class Monitor:
    """A choice's detectors and the values each gave, one per position fed."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self.detectors = tuple(detectors)
        self._parts: list[list[Any]] = [[] for _ in self.detectors]
        self._by_layer: dict[int, list[int]] = {}
        for i, detector in enumerate(self.detectors):
            self._by_layer.setdefault(detector.layer, []).append(i)

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers to hook, ascending."""
        return tuple(sorted(self._by_layer))

    def feed(self, layer: int, rows: Any) -> None:
        """Layer `layer`'s output rows [positions, width] of one pass."""
        for i in self._by_layer.get(layer, ()):
            self._parts[i].append(self.detectors[i].values(rows))

    def values(self, i: int) -> list[float]:
        """Detector i's values so far, one per position fed."""
        out: list[float] = []
        for part in list(self._parts[i]):
            out.extend(float(v) for v in part.tolist())
        return out
