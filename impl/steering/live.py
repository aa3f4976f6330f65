"""The operator's steering state: attached SAEs, live ("manual") values, the active profile.

The management API changes it; every change an operator makes moves the
steering epoch (OAI-INL-04: requests never do) and swaps in a new snapshot
per model, which generation hooks read at every forward pass. So an
operator's change reaches a running generation at its next token and wins
over the request's own steering (OAI-CONC-01); nothing is ever restored
over it (OAI-CONC-02).

An attachment is an SAE at one layer of one model (the same SAE may attach
at two layers). It steers only while that model is resident; attachments,
their live values and the active profile are kept in SQLite, so a restart
finds them again. The global state, per model, is: for each attachment,
the active profile if it claims that SAE and layer (`profile`,
`source=active`, scaled by the profile's persistent dial), else the live
values set on it (`manual`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ApiError, InvalidParameter
from ..store.database import Database
from ..store.profiles import Profile, ProfileStore
from . import dial
from .applied import EMPTY, AppliedSAE, Snapshot, applied_sae, snapshot
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
        self, saes: SAERegistry, profiles: ProfileStore, db: Database, bounds: dial.Bounds
    ) -> None:
        self.saes = saes
        self.profiles = profiles
        self.bounds = bounds
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
        lam = dial.resolve(profile.intensity if intensity is None else intensity, bounds)
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

    def is_live(self, model_id: str, sae_id: str, layer: int, kind: str) -> bool:
        """Whether `model_id`'s global state has a `kind` item for this SAE and layer."""
        _, snap = self.read(model_id)
        return any(
            i.kind == kind and i.sae.sae_id == sae_id and i.layer == layer for i in snap.items
        )

    # -- operator changes (event loop) ------------------------------------------------

    def attach(
        self, model_id: str, sae_id: str, layer: int | None, *, width: int, depth: int
    ) -> bool:
        """Attach SAE `sae_id` at `layer` (default: its hook layer); False if it already was.

        `width` and `depth` are the resident model's d_model and layer count.
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

    def changed(self) -> None:
        """Rebuild every model's snapshot and move the epoch: an operator changed steering."""
        active = self.profiles.active()
        snapshots: dict[str, Snapshot] = {}
        for model_id in {a.model_id for a in self._attachments.values()}:
            snapshots[model_id] = self._global(model_id, active)
        self._state = _State(self._state.epoch + 1, snapshots)
        log.info("steering epoch %d", self._state.epoch)

    # -- internals ------------------------------------------------------------------

    def _global(self, model_id: str, active: Profile | None) -> Snapshot:
        claimed = None if active is None else self.profile_applied_sae(active, model_id, "active")
        items: list[AppliedSAE] = [] if claimed is None else [claimed]
        for attachment in self.attachments(model_id):
            if claimed is not None and attachment.pair == (claimed.sae.sae_id, claimed.layer):
                continue
            if attachment.manual:
                items.append(
                    applied_sae("manual", attachment.sae, attachment.layer, attachment.manual)
                )
        return snapshot(items)

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

    def _restore(self) -> None:
        """Attachments from the database; one whose SAE is gone is dropped with a warning."""
        with self._db.transaction() as db:
            rows = db.execute("SELECT model_id, sae_id, layer, manual FROM attachments").fetchall()
        for model_id, sae_id, layer, manual in rows:
            try:
                sae = self.saes.get(str(sae_id))
            except (KeyError, SAEFormatError) as exc:
                log.warning("dropping attachment of SAE %s: %s", sae_id, exc)
                continue
            values = {int(i): float(s) for i, s in json.loads(str(manual))}
            key = (str(model_id), str(sae_id), int(layer))
            self._attachments[key] = Attachment(key[0], sae, key[2], values)
        self.changed()
