"""What steering applies: items (one SAE at one layer) and snapshots (a whole state).

An `AppliedSAE` is one SAE at one layer: its kind (`profile`, `inline`,
`manual`, or `circuit`: one (SAE, layer) of a circuit), the SAE and layer it
steers, the applied set (index → strength as the hook reads it: clamped to
±200, zeros and -0.0 dropped), how many strengths the clamp changed, and the
vector Σ strength·W_dec[i] the hook adds. A `Snapshot` is every item that
steers at once, with the vectors summed per layer (two SAEs at one layer both
add) and a key naming the state for the engine's kept KV prefix. Each SAE
item is one X-miLLM-Steering member; a circuit's items fold into one
`circuit` member per circuit (OAI-GRAM-12), `composed` when a layer it steers
carries another circuit too. Both are immutable: the live state swaps whole
snapshots, so a hook never sees half of a change.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from .hashing import LIMIT, scaled
from .header import CircuitMember, Member, inline_member, manual_member, profile_member
from .rung import CircuitState
from .sae import SAE

APPLIED_KINDS = ("profile", "inline", "manual", "circuit")


@dataclass(frozen=True, slots=True, eq=False, kw_only=True)
class AppliedSAE:
    """One SAE at one layer, as applied."""

    kind: str
    sae: SAE
    layer: int
    applied: Mapping[int, float]
    clamped: int
    vector: torch.Tensor
    name: str = ""  # the profile's name, or the circuit's id
    source: str = ""
    intensity: float = 1.0
    rung: int = 0  # a circuit's evidence rung

    def member(self) -> Member:
        """This SAE item's X-miLLM-Steering member (a circuit's: Snapshot.members)."""
        sae_id = self.sae.sae_id
        if self.kind == "profile":
            return profile_member(
                self.name,
                self.source,
                self.intensity,
                sae_id,
                layer=self.layer,
                applied=self.applied,
                clamped=self.clamped,
            )
        if self.kind == "inline":
            return inline_member(sae_id, self.layer, self.applied, self.clamped)
        return manual_member(sae_id, self.layer, self.applied)

    def key(self) -> Hashable:
        return (self.layer, self.sae.sae_id, tuple(sorted(self.applied.items())))


def applied_sae(
    kind: str,
    sae: SAE,
    layer: int,
    strengths: Mapping[int, float],
    *,
    scale: float = 1.0,
    name: str = "",
    source: str = "",
    rung: int = 0,
) -> AppliedSAE:
    """The item applying clamp(strength × scale) for each feature of `sae` at `layer`.

    Raises IndexError for an index outside 0..d_sae-1 and ValueError for a
    strength that is not a finite number; callers check both first and
    name the field.
    """
    if kind not in APPLIED_KINDS:
        raise ValueError(f"unknown steering kind {kind!r}")
    for index, strength in sorted(strengths.items()):
        if isinstance(strength, bool) or not math.isfinite(float(strength)):
            raise ValueError(f"strength of feature {index} must be a finite number")
        if not 0 <= index < sae.d_sae:
            raise IndexError(f"feature {index} is outside 0..{sae.d_sae - 1}")
    applied, clamped = scaled(strengths, scale)
    vector = torch.zeros(sae.d_in, dtype=sae.W_dec.dtype)
    if applied:
        indices = torch.tensor(list(applied), dtype=torch.long)
        values = torch.tensor(list(applied.values()), dtype=torch.float64)
        vector = (values.to(sae.W_dec.dtype) @ sae.W_dec[indices]).contiguous()
    return AppliedSAE(
        kind=kind,
        sae=sae,
        layer=layer,
        applied=MappingProxyType(applied),
        clamped=clamped,
        vector=vector,
        name=name,
        source=source,
        intensity=scale,
        rung=rung,
    )


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """A whole steering state: its items and the vector each hooked layer adds."""

    items: tuple[AppliedSAE, ...] = ()
    vectors: Mapping[int, torch.Tensor] = field(default_factory=dict)
    key: Hashable = ()
    unreadable: tuple[str, ...] = ()  # active circuits whose definition cannot be parsed

    def members(self, layers: Iterable[int] | None = None) -> list[Member]:
        """Header members of the items (only those at `layers`, when given): one per SAE
        item, one per circuit."""
        kept = self._at(layers)
        members = [i.member() for i in kept if i.kind != "circuit"]
        circuits: dict[str, list[AppliedSAE]] = {}
        for item in kept:
            if item.kind == "circuit":
                circuits.setdefault(item.name, []).append(item)
        for circuit_id, own in circuits.items():
            mine = {i.layer for i in own}
            others = {i.layer for c, items in circuits.items() if c != circuit_id for i in items}
            members.append(
                CircuitMember(circuit_id, own[0].intensity, composed=bool(mine & others))
            )
        return members

    def circuits(self, layers: Iterable[int] | None = None) -> list[CircuitState]:
        """The circuits steering in this state (and the unreadable active ones), as the
        rung header sees them (steering/rung.py)."""
        kept = self._at(layers)
        rungs = {i.name: i.rung for i in kept if i.kind == "circuit"}
        states = [CircuitState(id=c, rung=r) for c, r in sorted(rungs.items())]
        return states + [CircuitState(id=c, rung=None) for c in self.unreadable]

    def layers(self) -> frozenset[int]:
        return frozenset(self.vectors)

    def _at(self, layers: Iterable[int] | None) -> list[AppliedSAE]:
        keep = None if layers is None else frozenset(layers)
        return [i for i in self.items if keep is None or i.layer in keep]


EMPTY = Snapshot()


def snapshot(items: Iterable[AppliedSAE], unreadable: Iterable[str] = ()) -> Snapshot:
    """The snapshot of `items`: vectors summed per layer, layers with nothing applied skipped."""
    kept = tuple(sorted(items, key=lambda i: (i.layer, i.sae.sae_id, i.kind, i.name)))
    vectors: dict[int, torch.Tensor] = {}
    for entry in kept:
        if entry.applied:
            previous = vectors.get(entry.layer)
            vectors[entry.layer] = entry.vector if previous is None else previous + entry.vector
    key = tuple(entry.key() for entry in kept if entry.applied)
    return Snapshot(kept, MappingProxyType(vectors), key, tuple(sorted(set(unreadable))))


__all__ = ["APPLIED_KINDS", "EMPTY", "LIMIT", "AppliedSAE", "Snapshot", "applied_sae", "snapshot"]
