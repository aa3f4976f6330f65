"""A circuit: a multi-layer intervention across several SAEs (REQ-000 CIRCUIT, issue 19).

`parse` reads a `mi.circuit/v1` document (spec/schemas/mi-circuit-v1.json):
the schema first, its first refusal naming the JSON pointer as a field
(`members[2].strength`), then what a schema cannot say (a member listed twice,
a slice-fallback circuit without its backing cluster, a non-finite strength, a
rung above every step of its evidence ladder).

`Circuit.applied(λ)` re-derives each member from its authored strength, never
from an earlier dial (OAI-CIRCUIT-08): strength × λ clamped to ±200 one member
at a time (OAI-CIRCUIT-09), grouped per (SAE, layer), since each member goes
through the SAE attached at its own layer (OAI-CIRCUIT-02). `Circuit.dial`
resolves a λ by the circuit rule (dial.circuit_lambda).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import contract
from . import dial
from .hashing import scaled

SCHEMA = "mi-circuit-v1.json"


class CircuitError(ValueError):
    """A document that is not a usable circuit (`param` names the field at fault)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Member:
    sae_id: str
    layer: int
    index: int
    strength: float  # as authored


@dataclass(frozen=True, slots=True)
class Applied:
    """One (SAE, layer) of a circuit at some λ: index → clamped strength, zeros dropped."""

    sae_id: str
    layer: int
    strengths: Mapping[int, float]
    clamped: int  # members whose value the ±200 clamp changed


@dataclass(frozen=True, slots=True, kw_only=True)
class Circuit:
    id: str
    members: tuple[Member, ...]
    rung: int
    name: str = ""
    description: str = ""
    intensity: float = 1.0
    intensity_range: tuple[float, float] | None = None
    mode: str = "circuit"
    backing_cluster: str | None = None
    ladder: tuple[Mapping[str, Any], ...] = ()

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({m.layer for m in self.members}))

    def bounds(self, envelope: dial.Bounds) -> dial.Bounds:
        """The dial's bounds: the authored range within the configured envelope."""
        return dial.Bounds.within(self.intensity_range, envelope)

    def dial(self, value: dial.Dial | None, envelope: dial.Bounds) -> float:
        """λ for a request's `steering_intensity` (None: the persistent dial), by the
        circuit rule (OAI-CIRCUIT-03..07)."""
        chosen = self.intensity if value is None else value
        declared = self.intensity_range is not None
        return dial.circuit_lambda(chosen, self.bounds(envelope), declared=declared)

    def groups(self) -> dict[tuple[int, str], dict[int, float]]:
        """(layer, SAE) -> index -> authored strength, by layer then SAE."""
        groups: dict[tuple[int, str], dict[int, float]] = {}
        for m in sorted(self.members, key=lambda m: (m.layer, m.sae_id, m.index)):
            groups.setdefault((m.layer, m.sae_id), {})[m.index] = m.strength
        return groups

    def applied(self, scale: float) -> list[Applied]:
        """Every (SAE, layer) the circuit steers at λ = `scale`, by layer then SAE."""
        found: list[Applied] = []
        for (layer, sae_id), authored in self.groups().items():
            strengths, clamped = scaled(authored, scale)
            found.append(Applied(sae_id, layer, strengths, clamped))
        return found


def parse(raw: Any) -> Circuit:
    """The circuit a `mi.circuit/v1` document defines, or CircuitError naming the field."""
    broken = contract.first_error(SCHEMA, raw)
    if broken is not None:
        field, message = broken
        raise CircuitError(f"The circuit document is invalid at `{field}`: {message}", field)
    members: list[Member] = []
    seen: dict[tuple[str, int, int], int] = {}
    for j, item in enumerate(raw["members"]):
        strength = item["strength"]
        if isinstance(strength, bool) or not math.isfinite(float(strength)):
            raise CircuitError(f"members[{j}].strength is not a finite number", f"members[{j}]")
        key = (item["sae_id"], item["layer"], item["index"])
        if key in seen:
            raise CircuitError(
                f"members[{j}] repeats members[{seen[key]}] (sae_id, layer, index)",
                f"members[{j}].index",
            )
        seen[key] = j
        members.append(Member(item["sae_id"], item["layer"], item["index"], float(strength)))
    mode = raw.get("mode", "circuit")
    backing = raw.get("backing_cluster")
    if mode == "slice_fallback" and not backing:
        raise CircuitError("a slice_fallback circuit names its backing_cluster", "backing_cluster")
    declared = raw.get("intensity_range")
    if declared is not None and declared[0] > declared[1]:
        raise CircuitError("intensity_range must be [low, high], low <= high", "intensity_range")
    evidence = raw["evidence"]
    climbed = [step["rung"] for step in evidence.get("ladder", ())]
    if climbed and evidence["rung"] > max(climbed):  # the rung is the ladder's (OAI-RUNG-03)
        raise CircuitError(
            f"evidence.rung {evidence['rung']} is above every step of its ladder "
            f"(highest {max(climbed)}): a circuit claims no evidence its ladder lacks",
            "evidence.rung",
        )
    return Circuit(
        id=raw["id"],
        members=tuple(members),
        rung=int(evidence["rung"]),
        ladder=tuple(evidence.get("ladder", ())),
        name=raw.get("name", ""),
        description=raw.get("description", ""),
        intensity=float(raw.get("intensity", 1.0)),
        intensity_range=None if declared is None else (float(declared[0]), float(declared[1])),
        mode=mode,
        backing_cluster=backing,
    )
