"""The steering management API (spec/openapi/api.yaml): SAEs, attachments, profiles.

Each operation changes the live state or the profile store and answers
with the shape the spec names. A change answers `live` (OAI-CONC-03):
whether the hooks apply the value it set to the next generation, and
`steering`: the X-miLLM-Steering value a request without steering fields
would get now.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .. import contract
from ..engines.capabilities import Steerable
from ..errors import ApiError, InvalidParameter
from ..models.manager import ModelManager
from ..store.profiles import Profile, ProfileError, ProfileNotFound
from .header import serialize
from .live import Attachment, LiveSteering
from .sae import SAE, SAEFormatError

log = logging.getLogger(__name__)
CLUSTER_SCHEMA = "mi-cluster-v1.json"


def _features(pairs: Mapping[int, float] | Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return [{"index": i, "strength": s} for i, s in sorted(items)]


Features = Sequence[tuple[int, float]]  # (index, strength) pairs, in the order sent


def _strengths(features: Features, param: str) -> dict[int, float]:
    """The pairs as a map; an index listed twice is 400 naming its second place."""
    strengths: dict[int, float] = {}
    for j, (index, strength) in enumerate(features):
        if index in strengths:
            raise InvalidParameter(f"{param}[{j}].index", f"Feature index {index} is listed twice.")
        strengths[index] = strength
    return strengths


class SteeringAdmin:
    def __init__(self, live: LiveSteering, manager: ModelManager) -> None:
        self._live = live
        self._manager = manager

    # -- views ---------------------------------------------------------------------

    def resident_id(self) -> str | None:
        resident = self._manager.resident
        return None if resident is None else resident.entry.model_id

    def _model(self, model: str | None) -> str:
        """The model an attachment path means: `model`, else the resident one."""
        if model is not None:
            return model
        resident = self.resident_id()
        if resident is None:
            raise ApiError("no_model", "No model is loaded; name one with `?model=`.", "model")
        return resident

    def steering(self) -> str:
        """X-miLLM-Steering for a request without steering fields, on the resident model, now."""
        model = self.resident_id()
        if model is None:
            return "none"
        _, snap = self._live.read(model)
        return serialize(snap.members())

    def _attachment(self, attachment: Attachment) -> dict[str, Any]:
        return {
            "model": attachment.model_id,
            "sae_id": attachment.sae.sae_id,
            "layer": attachment.layer,
            "d_sae": attachment.sae.d_sae,
            "features": _features(attachment.manual),
            "live": self._manual_live(attachment),
        }

    def _manual_live(self, attachment: Attachment) -> bool:
        return attachment.model_id == self.resident_id() and self._live.is_live(
            attachment.model_id, attachment.sae.sae_id, attachment.layer, "manual"
        )

    def state(self) -> dict[str, Any]:
        active = self._live.profiles.active()
        return {
            "model": self.resident_id(),
            "epoch": self._live.epoch,
            "steering": self.steering(),
            "attachments": [self._attachment(a) for a in self._live.attachments()],
            "active_profile": None if active is None else active.name,
            "active_circuits": [row.id for row in self._live.circuits.active()],
        }

    def saes(self) -> dict[str, Any]:
        data = []
        for sae_id in self._live.saes.ids():
            attached = [
                {"model": a.model_id, "layer": a.layer}
                for a in self._live.attachments()
                if a.sae.sae_id == sae_id
            ]
            try:
                sae = self._live.saes.get(sae_id)
            except SAEFormatError as exc:
                data.append(
                    {
                        "id": sae_id,
                        "architecture": "standard",
                        "d_in": 0,
                        "d_sae": 0,
                        "hook_name": "",
                        "layer": 0,
                        "attached": attached,
                        "error": str(exc),
                    }
                )
                continue
            data.append(
                {
                    "id": sae_id,
                    "architecture": sae.architecture,
                    "d_in": sae.d_in,
                    "d_sae": sae.d_sae,
                    "hook_name": sae.hook_name,
                    "layer": sae.layer,
                    "attached": attached,
                    "error": None,
                }
            )
        return {"object": "list", "data": data}

    # -- attachments -----------------------------------------------------------------

    def attach(self, sae_id: str, layer: int | None) -> tuple[dict[str, Any], bool]:
        resident = self._manager.resident
        if resident is None:
            raise ApiError("no_model", "No model is loaded to attach an SAE to.", "sae_id")
        entry, engine = resident.entry, resident.engine
        if not isinstance(engine, Steerable):
            raise InvalidParameter(
                "sae_id",
                f"The resident model `{entry.model_id}` runs on {entry.engine}, which cannot be "
                "steered.",
            )
        facts = engine.facts
        created = self._live.attach(
            entry.model_id,
            sae_id,
            layer,
            width=facts.d_model,
            depth=facts.n_layers,
            steerable=engine.steerable_layers,
        )
        at = self._live.saes.get(sae_id).layer if layer is None else layer
        return self._change(self._live.find(entry.model_id, sae_id, at)), created

    def detach(self, sae_id: str, layer: int, model: str | None) -> dict[str, Any]:
        self._live.detach(self._model(model), sae_id, layer)
        return self.state()

    def set_values(
        self, sae_id: str, layer: int, model: str | None, features: Features
    ) -> dict[str, Any]:
        model_id = self._model(model)
        self._live.set_manual(model_id, sae_id, layer, _strengths(features, "features"))
        return self._change(self._live.find(model_id, sae_id, layer))

    def _change(self, attachment: Attachment) -> dict[str, Any]:
        view = self._attachment(attachment)
        return {
            "attachment": view,
            "live": view["live"],
            "epoch": self._live.epoch,
            "steering": self.steering(),
        }

    # -- profiles --------------------------------------------------------------------

    def _profile_live(self, profile: Profile) -> bool:
        model = self.resident_id()
        active = self._live.profiles.active()
        return (
            model is not None
            and active is not None
            and active.name == profile.name
            and self._live.is_live(model, profile.sae_id, profile.layer, "profile")
        )

    def _profile(self, profile: Profile) -> dict[str, Any]:
        active = self._live.profiles.active()
        return {
            "name": profile.name,
            "sae_id": profile.sae_id,
            "layer": profile.layer,
            "features": _features(profile.features),
            "description": profile.description,
            "intensity": profile.intensity,
            "intensity_range": None
            if profile.intensity_range is None
            else list(profile.intensity_range),
            "created": int(profile.created),
            "updated": int(profile.updated),
            "active": active is not None and active.name == profile.name,
        }

    def _get(self, name: str) -> Profile:
        try:
            return self._live.profiles.get(name)
        except ProfileNotFound:
            raise ApiError("profile_not_found", f"No profile named `{name}`.", "name") from None

    def profiles(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._profile(p) for p in self._live.profiles.list()]}

    def profile(self, name: str) -> dict[str, Any]:
        return self._profile(self._get(name))

    def put_profile(
        self,
        name: str,
        *,
        sae_id: str,
        layer: int,
        features: Features,
        description: str | None = None,
        intensity: float | None = None,
        intensity_range: Sequence[float] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Create or replace `name`; True when it was created."""
        store = self._live.profiles
        try:
            store.get(name)
            created = False
        except ProfileNotFound:
            created = True
        strengths = _strengths(features, "features")
        try:
            profile = store.save(
                name,
                sae_id,
                layer,
                list(strengths.items()),
                description=description or "",
                intensity=1.0 if intensity is None else intensity,
                intensity_range=intensity_range,
            )
        except ProfileError as exc:
            raise InvalidParameter(exc.param, f"The profile is invalid: {exc}.") from exc
        if self._live.is_base(name):
            self._live.changed()
        return {
            "profile": self._profile(profile),
            "live": self._profile_live(profile),
            "epoch": self._live.epoch,
            "steering": self.steering(),
        }, created

    def import_cluster(self, document: Any) -> tuple[dict[str, Any], bool]:
        """Create or replace the profile a `mi.cluster/v1` document defines (a cluster is a
        profile); a refusal names the document's field (issue 19 item 1)."""
        broken = contract.first_error(CLUSTER_SCHEMA, document)
        if broken is not None:
            field, message = broken
            raise InvalidParameter(
                field, f"The cluster document is invalid at `{field}`: {message}"
            )
        self._fits(document)
        declared = document.get("intensity_range")
        return self.put_profile(
            document["name"],
            sae_id=document["sae_id"],
            layer=document["layer"],
            features=[(f["index"], f["strength"]) for f in document["features"]],
            description=document.get("description"),
            intensity=document.get("intensity"),
            intensity_range=declared,
        )

    def sae_of(self, sae_id: str, param: str) -> SAE:
        """The SAE an imported document names, from the saes directory (400 naming `param`:
        a document comes from elsewhere, so its SAE may be missing here)."""
        try:
            return self._live.saes.get(sae_id)
        except KeyError:
            raise InvalidParameter(
                param, f"No SAE `{sae_id}` in the saes directory (GET /api/saes lists them)."
            ) from None
        except SAEFormatError as exc:
            raise InvalidParameter(param, f"SAE `{sae_id}` cannot be loaded: {exc}") from exc

    def _fits(self, document: Any) -> None:
        """An imported cluster names an SAE of the saes directory, and features it has."""
        sae_id = document["sae_id"]
        sae = self.sae_of(sae_id, "sae_id")
        for j, feature in enumerate(document["features"]):
            if feature["index"] >= sae.d_sae:
                raise InvalidParameter(
                    f"features[{j}].index",
                    f"Feature {feature['index']} is outside `{sae_id}`'s 0..{sae.d_sae - 1}.",
                )

    def set_dial(self, name: str, intensity: float) -> dict[str, Any]:
        """A profile's (cluster's) persistent dial λ (OAI-DIAL-02), nothing else changed."""
        profile = self._get(name)
        view, _ = self.put_profile(
            name,
            sae_id=profile.sae_id,
            layer=profile.layer,
            features=list(profile.features),
            description=profile.description,
            intensity=intensity,
            intensity_range=profile.intensity_range,
        )
        return view

    def delete_profile(self, name: str) -> dict[str, Any]:
        based = self._live.is_base(self._get(name).name)
        self._live.profiles.delete(name)
        if based:
            self._live.changed()
        return self.state()

    def active(self) -> dict[str, Any]:
        profile = self._live.profiles.active()
        return {
            "name": None if profile is None else profile.name,
            "live": profile is not None and self._profile_live(profile),
            "epoch": self._live.epoch,
            "steering": self.steering(),
        }

    def activate(self, name: str | None) -> dict[str, Any]:
        try:
            self._live.profiles.activate(name)
        except ProfileNotFound:
            raise ApiError("profile_not_found", f"No profile named `{name}`.", "name") from None
        self._live.changed()
        return self.active()
