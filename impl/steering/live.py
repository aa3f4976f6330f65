"""The operator's steering state: attached SAEs, live ("manual") values, the active
profile and the active circuits.

The management API changes it; every change an operator makes moves the
steering epoch (OAI-INL-04: requests never do) and swaps in a new snapshot
per model, which generation hooks read at every forward pass. So an
operator's change reaches a running generation at its next token and wins
over the request's own steering (OAI-CONC-01); nothing is ever restored
over it (OAI-CONC-02).

An attachment is an SAE at one layer of one model (the same SAE may attach
at two layers). It steers only while that model is resident; attachments,
their live values and the active profile are kept in SQLite, so a restart
finds them again. The global state, per model, is made of its bases:

    the active profile   its SAE and layer (`profile`, `source=active`), scaled by
                         its persistent dial by the cluster rule (OAI-DIAL)
    each active circuit  every (SAE, layer) of it that is attached (`circuit`),
                         authored strengths x its persistent dial by the circuit
                         rule (OAI-CIRCUIT); in `slice_fallback` mode its backing
                         cluster instead, by the cluster rule (OAI-CIRCUIT-10)

and, on each attachment no base claims, the live values set on it (`manual`).
Bases on one layer add up. A request's λ alone (`dialled`) re-derives every base
at that λ, each by its own rule.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ApiError, InvalidParameter
from ..store.circuits import CircuitRow, CircuitStore
from ..store.database import Database
from ..store.profiles import Profile, ProfileNotFound, ProfileStore
from . import circuit as circuits
from . import dial
from .applied import EMPTY, AppliedSAE, Snapshot, applied_sae, snapshot
from .circuit import Circuit, CircuitError
from .hashing import LIMIT
from .sae import SAE, SAEFormatError, SAERegistry

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Attachment:
    """One SAE attached at one layer of one model, with its live values."""

    model_id: str
    sae: SAE
    layer: int
    manual: dict[int, float] = field(default_factory=dict)

    @property
    def pair(self) -> tuple[str, int]:
        return (self.sae.sae_id, self.layer)


@dataclass(frozen=True, slots=True)
class _State:
    epoch: int
    snapshots: Mapping[str, Snapshot]
    profile: Profile | None = None  # the active profile
    circuits: tuple[Circuit, ...] = ()  # the active circuits, at their persistent dials
    unreadable: tuple[str, ...] = ()  # active circuits whose document no longer parses


@dataclass(frozen=True, slots=True)
class Dialled:
    """The global state with a request's λ applied to every base, and the λ to echo."""

    snapshot: Snapshot
    echo: float


def load_circuit(row: CircuitRow) -> Circuit:
    """The circuit a stored row holds, at its persistent dial (CircuitError if unreadable)."""
    try:
        document = row.parsed()
    except ValueError as exc:
        raise CircuitError(f"the stored document is not JSON: {exc}", "") from exc
    return dataclasses.replace(circuits.parse(document), intensity=row.intensity)


def check_strengths(
    sae: SAE, features: Mapping[int, float], param: str, *, limit: float | None = None
) -> None:
    """Refuse indices outside the SAE and strengths that are not finite (or past `limit`)."""
    for index, strength in features.items():
        if not 0 <= index < sae.d_sae:
            raise ApiError(
                "INVALID_FEATURE_INDEX",
                f"Feature index {index} is outside 0..{sae.d_sae - 1} of SAE `{sae.sae_id}`.",
                param,
            )
        if isinstance(strength, bool) or not math.isfinite(float(strength)):
            raise InvalidParameter(param, f"The strength of feature {index} must be finite.")
        if limit is not None and abs(float(strength)) > limit:
            raise InvalidParameter(
                param, f"The strength of feature {index} ({strength}) is outside ±{limit:g}."
            )


class LiveSteering:
    """Attachments, live values and the active profile, with the epoch and snapshots."""

    def __init__(
        self,
        saes: SAERegistry,
        profiles: ProfileStore,
        db: Database,
        bounds: dial.Bounds,
        *,
        circuits: CircuitStore,
        circuit_bounds: dial.Bounds,
    ) -> None:
        self.saes = saes
        self.profiles = profiles
        self.circuits = circuits
        self.bounds = bounds  # a cluster's (profile's) when it declares no range
        self.circuit_bounds = circuit_bounds  # the envelope of a circuit's dial
        self._db = db
        self._attachments: dict[tuple[str, str, int], Attachment] = {}
        self._state = _State(0, {})
        self._restore()

    # -- reading (any thread) -----------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._state.epoch

    def read(self, model_id: str) -> tuple[int, Snapshot]:
        """The epoch and `model_id`'s global snapshot, read together."""
        state = self._state
        return state.epoch, state.snapshots.get(model_id, EMPTY)

    def attachments(self, model_id: str | None = None) -> list[Attachment]:
        """Attachments (of one model, when given), by model, layer and SAE."""
        found = [a for a in self._attachments.values() if model_id in (None, a.model_id)]
        return sorted(found, key=lambda a: (a.model_id, a.layer, a.sae.sae_id))

    def find(self, model_id: str, sae_id: str, layer: int) -> Attachment:
        attachment = self._attachments.get((model_id, sae_id, layer))
        if attachment is None:
            raise ApiError(
                "not_found",
                f"SAE `{sae_id}` is not attached at layer {layer} of `{model_id}`.",
                "sae_id",
            )
        return attachment

    def profile_applied_sae(
        self, profile: Profile, model_id: str, source: str, intensity: float | None = None
    ) -> AppliedSAE | None:
        """`profile` applied at λ (its stored dial when None); None if its SAE is not attached."""
        attachment = self._attachments.get((model_id, profile.sae_id, profile.layer))
        if attachment is None:
            return None
        bounds = dial.Bounds.of(profile.intensity_range, self.bounds)
        lam = dial.cluster_lambda(profile.intensity if intensity is None else intensity, bounds)
        strengths = profile.strengths()
        if any(not 0 <= i < attachment.sae.d_sae for i in strengths):
            return None
        return applied_sae(
            "profile",
            attachment.sae,
            attachment.layer,
            strengths,
            scale=lam,
            name=profile.name,
            source=source,
        )

    def is_base(self, profile: str) -> bool:
        """Whether the profile steers globally: it is active, or it backs an active
        slice-fallback circuit (a change to it must rebuild the snapshots)."""
        state = self._state
        return (state.profile is not None and state.profile.name == profile) or any(
            c.mode == "slice_fallback" and c.backing_cluster == profile for c in state.circuits
        )

    def is_live(self, model_id: str, sae_id: str, layer: int, kind: str) -> bool:
        """Whether `model_id`'s global state has a `kind` item for this SAE and layer."""
        _, snap = self.read(model_id)
        return any(
            i.kind == kind and i.sae.sae_id == sae_id and i.layer == layer for i in snap.items
        )

    # -- operator changes (event loop) ------------------------------------------------

    def attach(
        self,
        model_id: str,
        sae_id: str,
        layer: int | None,
        *,
        width: int,
        depth: int,
        steerable: range | None = None,
    ) -> bool:
        """Attach SAE `sae_id` at `layer` (default: its hook layer); False if it already was.

        `width` and `depth` are the resident model's d_model and layer count; `steerable`
        the layers its engine steers (None: every one).
        """
        sae = self._sae(sae_id)
        at = sae.layer if layer is None else layer
        if sae.d_in != width:
            raise InvalidParameter(
                "sae_id",
                f"SAE `{sae_id}` has d_in {sae.d_in}; the model `{model_id}` has d_model {width}.",
            )
        if not 0 <= at < depth:
            raise InvalidParameter(
                "layer", f"Layer {at} is outside 0..{depth - 1} of the model `{model_id}`."
            )
        if steerable is not None and at not in steerable:
            raise InvalidParameter(
                "layer",
                f"The model `{model_id}` is steered at layers {steerable.start}.."
                f"{steerable.stop - 1} (its engine's), not layer {at}.",
            )
        if (model_id, sae_id, at) in self._attachments:
            return False
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO attachments (model_id, sae_id, layer) VALUES (?, ?, ?)",
                (model_id, sae_id, at),
            )
        self._attachments[(model_id, sae_id, at)] = Attachment(model_id, sae, at)
        self.changed()
        return True

    def detach(self, model_id: str, sae_id: str, layer: int) -> None:
        self.find(model_id, sae_id, layer)
        with self._db.transaction() as db:
            db.execute(
                "DELETE FROM attachments WHERE model_id = ? AND sae_id = ? AND layer = ?",
                (model_id, sae_id, layer),
            )
        del self._attachments[(model_id, sae_id, layer)]
        self.changed()

    def set_manual(
        self, model_id: str, sae_id: str, layer: int, features: Mapping[int, float]
    ) -> None:
        """Replace the live values on one attachment (an empty mapping clears them)."""
        attachment = self.find(model_id, sae_id, layer)
        check_strengths(attachment.sae, features, "features", limit=LIMIT)
        values = {int(i): float(s) for i, s in features.items() if float(s) != 0.0}
        with self._db.transaction() as db:
            db.execute(
                "UPDATE attachments SET manual = ? WHERE model_id = ? AND sae_id = ? AND layer = ?",
                (json.dumps(sorted(values.items())), model_id, sae_id, layer),
            )
        attachment.manual = values
        self.changed()

    def changed(self, epoch: int | None = None) -> None:
        """Rebuild every model's snapshot and move the epoch (to `epoch`, when given: a
        cluster's): an operator changed steering."""
        active, unreadable = [], []
        for row in self.circuits.active():
            try:
                active.append(load_circuit(row))
            except CircuitError as exc:
                log.warning("active circuit %s cannot be read: %s", row.id, exc)
                unreadable.append(row.id)
        moved = self._state.epoch + 1 if epoch is None else epoch
        base = _State(moved, {}, self.profiles.active(), tuple(active), tuple(unreadable))
        snapshots: dict[str, Snapshot] = {}
        for model_id in {a.model_id for a in self._attachments.values()}:
            snapshots[model_id] = self._global(base, model_id, None)[0]
        self._state = dataclasses.replace(base, snapshots=snapshots)
        log.info("steering epoch %d", self._state.epoch)

    def dialled(self, model_id: str, value: dial.Dial) -> Dialled | None:
        """The global state with every base at the request's λ (OAI-DIAL-03, CIRCUIT-01);
        None when no base steers `model_id`. Live values stay as they are."""
        found, echo = self._global(self._state, model_id, value)
        return None if echo is None else Dialled(found, echo)

    def circuit_items(
        self, circuit: Circuit, model_id: str, value: dial.Dial | None = None
    ) -> tuple[list[AppliedSAE], float]:
        """A circuit's items on `model_id` at the request's λ (None: its persistent dial),
        and that λ. Each member goes through the SAE attached at its own layer (OAI-CIRCUIT-02);
        a (SAE, layer) not attached, or one whose SAE lacks an index, steers nothing."""
        if circuit.mode == "slice_fallback":
            return self._fallback(circuit, model_id, value)
        lam = circuit.dial(value, self.circuit_bounds)
        if lam == 0.0:
            return [], lam
        items: list[AppliedSAE] = []
        for (layer, sae_id), authored in circuit.groups().items():
            attachment = self._attachments.get((model_id, sae_id, layer))
            if attachment is None:
                continue
            if any(not 0 <= i < attachment.sae.d_sae for i in authored):
                log.warning("circuit %s names features past SAE %s", circuit.id, sae_id)
                continue
            item = applied_sae(
                "circuit",
                attachment.sae,
                layer,
                authored,
                scale=lam,
                name=circuit.id,
                rung=circuit.rung,
            )
            if item.applied:
                items.append(item)
        return items, lam

    # -- internals ------------------------------------------------------------------

    def backing(
        self, circuit: Circuit, value: dial.Dial | None = None
    ) -> tuple[Profile | None, float]:
        """A slice-fallback circuit's backing cluster (None when it is gone) and λ: the
        request's or the circuit's own dial, by the cluster rule, floor included
        (OAI-CIRCUIT-10)."""
        assert circuit.backing_cluster is not None
        try:
            profile = self.profiles.get(circuit.backing_cluster)
        except ProfileNotFound:
            log.warning("circuit %s: no backing cluster %s", circuit.id, circuit.backing_cluster)
            return None, 0.0
        bounds = dial.Bounds.of(profile.intensity_range, self.bounds)
        return profile, dial.cluster_lambda(circuit.intensity if value is None else value, bounds)

    def _fallback(
        self, circuit: Circuit, model_id: str, value: dial.Dial | None
    ) -> tuple[list[AppliedSAE], float]:
        """A slice-fallback circuit steers as its backing cluster: no `circuit` member, so no
        rung header."""
        profile, lam = self.backing(circuit, value)
        item = (
            None if profile is None else self.profile_applied_sae(profile, model_id, "active", lam)
        )
        return ([] if item is None else [item]), lam

    def _global(
        self, state: _State, model_id: str, value: dial.Dial | None
    ) -> tuple[Snapshot, float | None]:
        """`model_id`'s state from `state`'s bases, at λ = `value` (None: each base's own
        dial), and the λ to echo: the first steering circuit's (by id), else the active
        profile's, else a slice-fallback cluster's (None: no base steers)."""
        bases: list[tuple[list[AppliedSAE], float]] = []
        if state.profile is not None:
            lam = None
            if value is not None:
                bounds = dial.Bounds.of(state.profile.intensity_range, self.bounds)
                lam = dial.cluster_lambda(value, bounds)
            claimed = self.profile_applied_sae(state.profile, model_id, "active", lam)
            if claimed is not None:
                bases.append(([claimed], claimed.intensity))
        items: list[AppliedSAE] = []
        echoes: list[tuple[int, float]] = []  # (0 for a circuit, 1 for a profile; λ)
        for circuit in state.circuits:  # a circuit dialled to off is still a base
            found, lam = self.circuit_items(circuit, model_id, value)
            if circuit.mode == "circuit" and self._touches(circuit, model_id):
                echoes.append((0, lam))
            bases.append((found, lam))
        for found, lam in bases:  # a cluster that is already a base is not added again
            named = {i.name for i in items if i.kind == "profile"}
            fresh = [i for i in found if i.kind == "circuit" or i.name not in named]
            items += fresh
            if fresh and fresh[0].kind == "profile":
                echoes.append((1, lam))
        pairs = {(i.sae.sae_id, i.layer) for i in items}
        for attachment in self.attachments(model_id):
            if attachment.pair not in pairs and attachment.manual:
                items.append(
                    applied_sae("manual", attachment.sae, attachment.layer, attachment.manual)
                )
        echo = min(echoes, key=lambda e: e[0])[1] if echoes else None
        return snapshot(items, state.unreadable), echo

    def _touches(self, circuit: Circuit, model_id: str) -> bool:
        """Whether an SAE is attached on one of the circuit's (SAE, layer) pairs."""
        return any((model_id, sae, layer) in self._attachments for layer, sae in circuit.groups())

    def _sae(self, sae_id: str) -> SAE:
        try:
            return self.saes.get(sae_id)
        except KeyError:
            raise ApiError(
                "not_found",
                f"No SAE `{sae_id}` in {self.saes.saes_dir} (GET /api/saes lists them).",
                "sae_id",
            ) from None
        except SAEFormatError as exc:
            raise InvalidParameter("sae_id", f"SAE `{sae_id}` cannot be loaded: {exc}") from exc

    def reload(self, epoch: int | None = None) -> None:
        """Everything read again from the database, where another process of a cluster
        changed it; the epoch moves to `epoch` (the cluster's) when given."""
        self._restore(epoch)

    def _restore(self, epoch: int | None = None) -> None:
        """Attachments from the database; one whose SAE is gone is dropped with a warning."""
        with self._db.transaction() as db:
            rows = db.execute("SELECT model_id, sae_id, layer, manual FROM attachments").fetchall()
        found: dict[tuple[str, str, int], Attachment] = {}
        for model_id, sae_id, layer, manual in rows:
            try:
                sae = self.saes.get(str(sae_id))
            except (KeyError, SAEFormatError) as exc:
                log.warning("dropping attachment of SAE %s: %s", sae_id, exc)
                continue
            values = {int(i): float(s) for i, s in json.loads(str(manual))}
            key = (str(model_id), str(sae_id), int(layer))
            found[key] = Attachment(key[0], sae, key[2], values)
        self._attachments = found
        self.changed(epoch)
