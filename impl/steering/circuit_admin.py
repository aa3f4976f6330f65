"""The circuits management API (spec/openapi/api.yaml, tag `circuits`; issue 19).

A circuit is imported from a `mi.circuit/v1` document, kept in SQLite with its
persistent dial and whether it is active, and read back as the spec's
`Circuit`. Any number of circuits may be active: each is a steering base
(steering/live.py). Every change moves the steering epoch. `GET
/api/circuits/active` states what each active circuit applies per (SAE,
layer), with the steering-set hash, and in `steering` the evidence language
a request without steering fields gets now (OAI-RUNG-18): the same value
X-miLLM-Circuit-Rung carries, computed from the same snapshot.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ApiError, InvalidParameter
from ..store.circuits import CircuitNotFound, CircuitRow
from ..store.profiles import Profile, ProfileNotFound
from .admin import SteeringAdmin
from .circuit import Circuit, CircuitError, Member, parse
from .hashing import steering_set_hash
from .live import LiveSteering, load_circuit
from .rung import LANGUAGE, RequestState, rung_header
from .rung import parse as parse_rung

RESERVED = frozenset({"active"})  # path segments a circuit id cannot take


def _not_found(circuit_id: str) -> ApiError:
    return ApiError("circuit_not_found", f"No circuit `{circuit_id}` (GET /api/circuits).", "id")


class CircuitAdmin:
    def __init__(self, live: LiveSteering, steering: SteeringAdmin) -> None:
        self._live = live
        self._steering = steering  # the resident model, X-miLLM-Steering now, the SAEs

    # -- views ---------------------------------------------------------------------

    def _steers(self, circuit: Circuit) -> bool:
        """Whether the circuit steers the resident model now (in slice-fallback mode, by its
        backing cluster)."""
        model = self._steering.resident_id()
        if model is None:
            return False
        _, snap = self._live.read(model)
        if circuit.mode == "slice_fallback":
            return any(
                i.kind == "profile" and i.name == circuit.backing_cluster for i in snap.items
            )
        return any(i.kind == "circuit" and i.name == circuit.id for i in snap.items)

    def _view(self, row: CircuitRow) -> dict[str, Any]:
        try:
            document: Any = row.parsed()
        except ValueError:
            document = None
        view: dict[str, Any] = {
            "id": row.id,
            "intensity": row.intensity,
            "active": row.active,
            "created": int(row.created),
            "updated": int(row.updated),
            "document": document if isinstance(document, dict) else None,
        }
        try:
            circuit = load_circuit(row)
        except CircuitError as exc:
            unread = dict.fromkeys(("name", "rung", "language", "mode", "backing_cluster"))
            return {
                **view,
                **unread,
                "intensity_range": None,
                "layers": [],
                "members": 0,
                "live": False,
                "error": str(exc),
            }
        return {
            **view,
            "name": circuit.name,
            "rung": circuit.rung,
            "language": LANGUAGE[circuit.rung],
            "mode": circuit.mode,
            "backing_cluster": circuit.backing_cluster,
            "intensity_range": None
            if circuit.intensity_range is None
            else list(circuit.intensity_range),
            "layers": list(circuit.layers),
            "members": len(circuit.members),
            "live": row.active and self._steers(circuit),
            "error": None,
        }

    def _row(self, circuit_id: str) -> CircuitRow:
        try:
            return self._live.circuits.get(circuit_id)
        except CircuitNotFound:
            raise _not_found(circuit_id) from None

    def circuits(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._view(r) for r in self._live.circuits.rows()]}

    def circuit(self, circuit_id: str) -> dict[str, Any]:
        return self._view(self._row(circuit_id))

    def active(self) -> dict[str, Any]:
        """GET /api/circuits/active: each active circuit as applied, and the evidence."""
        model = self._steering.resident_id()
        evidence = None
        if model is not None:
            _, snap = self._live.read(model)
            value = rung_header(snap.circuits(), RequestState())
            if value is not None:
                rung, language = parse_rung(value)
                evidence = {"rung": rung, "language": language, "header": value}
        return {
            "model": model,
            "epoch": self._live.epoch,
            "circuits": [self._active(row, model) for row in self._live.circuits.active()],
            "steering": evidence,
            "x_millm_steering": self._steering.steering(),
        }

    def _active(self, row: CircuitRow, model: str | None) -> dict[str, Any]:
        try:
            circuit = load_circuit(row)
        except CircuitError as exc:
            return {
                "id": row.id,
                "rung": None,
                "language": None,
                "mode": None,
                "intensity": row.intensity,
                "resolved_intensity": None,
                "steering": False,
                "layers": [],
                "error": str(exc),
            }
        attached = (
            {(a.sae.sae_id, a.layer) for a in self._live.attachments(model)} if model else set()
        )
        if circuit.mode == "slice_fallback":
            profile, lam = self._live.backing(circuit)
            groups = _as_circuit(circuit, profile).applied(lam)
        else:
            lam = circuit.dial(None, self._live.circuit_bounds)
            groups = circuit.applied(lam)
        layers = [
            {
                "sae_id": group.sae_id,
                "layer": group.layer,
                "attached": (group.sae_id, group.layer) in attached,
                "features": len(group.strengths),
                "hash": steering_set_hash(group.sae_id, list(group.strengths.items())),
                "clamped": group.clamped,
            }
            for group in groups
        ]
        return {
            "id": row.id,
            "rung": circuit.rung,
            "language": LANGUAGE[circuit.rung],
            "mode": circuit.mode,
            "intensity": row.intensity,
            "resolved_intensity": lam,
            "steering": self._steers(circuit),
            "layers": layers,
            "error": None,
        }

    # -- changes -------------------------------------------------------------------

    def _change(self, circuit_id: str) -> dict[str, Any]:
        view = self.circuit(circuit_id)
        return {
            "circuit": view,
            "live": view["live"],
            "epoch": self._live.epoch,
            "steering": self._steering.steering(),
        }

    def import_circuit(self, document: Any) -> tuple[dict[str, Any], bool]:
        """Create or replace the circuit a `mi.circuit/v1` document defines; True if created."""
        try:
            circuit = parse(document)
        except CircuitError as exc:
            raise InvalidParameter(exc.param, str(exc)) from exc
        if circuit.id in RESERVED:
            raise InvalidParameter("id", f"`{circuit.id}` is a reserved path segment, not an id.")
        self._fits(circuit)
        created = self._live.circuits.save(circuit.id, document, circuit.intensity)
        self._live.changed()
        return self._change(circuit.id), created

    def _fits(self, circuit: Circuit) -> None:
        """Each member names an SAE of the saes directory and one of its features; a
        slice-fallback circuit names a cluster (profile) that exists."""
        for j, member in enumerate(circuit.members):
            sae = self._steering.sae_of(member.sae_id, f"members[{j}].sae_id")
            if member.index >= sae.d_sae:
                raise InvalidParameter(
                    f"members[{j}].index",
                    f"Feature {member.index} is outside `{member.sae_id}`'s 0..{sae.d_sae - 1}.",
                )
        if circuit.backing_cluster is not None and circuit.mode == "slice_fallback":
            try:
                self._live.profiles.get(circuit.backing_cluster)
            except ProfileNotFound:
                raise InvalidParameter(
                    "backing_cluster",
                    f"No cluster (profile) `{circuit.backing_cluster}` to fall back on; import "
                    "it first (POST /api/clusters).",
                ) from None

    def set_dial(self, circuit_id: str, intensity: float) -> dict[str, Any]:
        """A circuit's persistent dial (the circuit rule resolves it when applied)."""
        try:
            self._live.circuits.set_dial(circuit_id, intensity)
        except CircuitNotFound:
            raise _not_found(circuit_id) from None
        self._live.changed()
        return self._change(circuit_id)

    def delete(self, circuit_id: str) -> dict[str, Any]:
        try:
            self._live.circuits.delete(circuit_id)
        except CircuitNotFound:
            raise _not_found(circuit_id) from None
        self._live.changed()
        return self.active()

    def set_active(self, circuit_id: str, active: bool) -> dict[str, Any]:
        try:
            self._live.circuits.set_active(circuit_id, active)
        except CircuitNotFound:
            raise _not_found(circuit_id) from None
        self._live.changed()
        return self.active()


__all__ = ["CircuitAdmin"]


def _as_circuit(circuit: Circuit, profile: Profile | None) -> Circuit:
    """A slice-fallback circuit's backing cluster as a one-layer circuit (no members when the
    cluster is gone): what it applies in the circuit's stead."""
    if profile is None:
        return dataclasses.replace(circuit, members=())
    members = tuple(Member(profile.sae_id, profile.layer, i, s) for i, s in profile.features)
    return dataclasses.replace(circuit, members=members)
