"""Steering profiles, persisted: a named feature set for one SAE at one layer.

The active profile (the one steering every request that names none) is
stored too, so both survive a restart.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .database import PUT_SETTING, Database, upsert

ACTIVE_KEY = "active_profile"
COLUMNS = (
    "name", "sae_id", "layer", "features", "description", "created", "updated", "intensity",
    "intensity_range",
)  # fmt: skip
SAVE = upsert("profiles", ("name",), COLUMNS)
ENVELOPE_MAX = 2.0


class ProfileError(ValueError):
    """A profile that cannot be stored as given (`param` names the field at fault)."""

    def __init__(self, message: str, param: str = "features") -> None:
        super().__init__(message)
        self.param = param


class ProfileNotFound(KeyError):
    """No profile has this name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    name: str
    sae_id: str
    layer: int
    features: tuple[tuple[int, float], ...]
    description: str = ""
    created: float = 0.0
    updated: float = 0.0
    intensity: float = 1.0
    intensity_range: tuple[float, float] | None = None

    def strengths(self) -> dict[int, float]:
        return dict(self.features)


def _features(
    raw: Sequence[Mapping[str, object]] | Sequence[tuple[int, float]],
) -> tuple[tuple[int, float], ...]:
    pairs: list[tuple[int, float]] = []
    for item in raw:
        index, strength = (item["index"], item["strength"]) if isinstance(item, Mapping) else item
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**31:
            raise ProfileError(f"feature index {index!r} is not a non-negative integer")
        if isinstance(strength, bool) or not isinstance(strength, int | float):
            raise ProfileError(f"strength {strength!r} of feature {index} is not a number")
        if not math.isfinite(float(strength)):
            raise ProfileError(f"strength of feature {index} is not finite")
        pairs.append((index, float(strength)))
    indices = [i for i, _ in pairs]
    if len(set(indices)) != len(indices):
        duplicate = next(i for i in indices if indices.count(i) > 1)
        raise ProfileError(f"feature {duplicate} is listed twice")
    return tuple(sorted(pairs))


def _dial(intensity: float, intensity_range: Sequence[float] | None) -> None:
    """The persistent dial and the declared range lie in the envelope [0, 2] (OAI-DIAL)."""
    if isinstance(intensity, bool) or not 0.0 <= float(intensity) <= ENVELOPE_MAX:
        raise ProfileError(f"intensity {intensity!r} is outside 0..{ENVELOPE_MAX}", "intensity")
    if intensity_range is None:
        return
    if len(intensity_range) != 2 or any(isinstance(v, bool) for v in intensity_range):
        raise ProfileError("intensity_range must be two numbers [low, high]", "intensity_range")
    low, high = (float(v) for v in intensity_range)
    if not 0.0 <= low <= high <= ENVELOPE_MAX:
        raise ProfileError(
            f"intensity_range [{low}, {high}] must satisfy 0 <= low <= high <= {ENVELOPE_MAX}",
            "intensity_range",
        )


class ProfileStore:
    def __init__(self, database: Database) -> None:
        self._db = database

    def save(
        self,
        name: str,
        sae_id: str,
        layer: int,
        features: Sequence[Mapping[str, object]] | Sequence[tuple[int, float]],
        *,
        description: str = "",
        intensity: float = 1.0,
        intensity_range: Sequence[float] | None = None,
    ) -> Profile:
        """Create or replace the profile `name`."""
        if not name:
            raise ProfileError("a profile needs a name", "name")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2**31:
            raise ProfileError(f"layer {layer!r} is not a non-negative integer", "layer")
        pairs = _features(features)
        _dial(intensity, intensity_range)
        bounds = None if intensity_range is None else tuple(float(v) for v in intensity_range)
        now = time.time()
        with self._db.transaction() as db:
            row = db.execute("SELECT created FROM profiles WHERE name = ?", (name,)).fetchone()
            created = float(row[0]) if row else now
            db.execute(
                SAVE,
                (
                    name,
                    sae_id,
                    layer,
                    json.dumps(pairs),
                    description,
                    created,
                    now,
                    float(intensity),
                    None if bounds is None else json.dumps(bounds),
                ),
            )
        return Profile(
            name=name,
            sae_id=sae_id,
            layer=layer,
            features=pairs,
            description=description,
            created=created,
            updated=now,
            intensity=float(intensity),
            intensity_range=None if bounds is None else (bounds[0], bounds[1]),
        )

    def get(self, name: str) -> Profile:
        with self._db.transaction() as db:
            row = db.execute("SELECT * FROM profiles WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise ProfileNotFound(name)
        return _profile(row)

    def list(self) -> list[Profile]:
        with self._db.transaction() as db:
            rows = db.execute("SELECT * FROM profiles ORDER BY name").fetchall()
        return [_profile(row) for row in rows]

    def delete(self, name: str) -> None:
        """Remove a profile (and clear it as the active one)."""
        with self._db.transaction() as db:
            if db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount == 0:
                raise ProfileNotFound(name)
            db.execute("DELETE FROM settings_kv WHERE key = ? AND value = ?", (ACTIVE_KEY, name))

    def activate(self, name: str | None) -> None:
        """Make `name` the active profile (None: no active profile)."""
        with self._db.transaction() as db:
            if name is None:
                db.execute("DELETE FROM settings_kv WHERE key = ?", (ACTIVE_KEY,))
                return
            if db.execute("SELECT 1 FROM profiles WHERE name = ?", (name,)).fetchone() is None:
                raise ProfileNotFound(name)
            db.execute(PUT_SETTING, (ACTIVE_KEY, name))

    def active(self) -> Profile | None:
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT p.* FROM profiles p JOIN settings_kv s ON s.value = p.name WHERE s.key = ?",
                (ACTIVE_KEY,),
            ).fetchone()
        return _profile(row) if row else None


def _profile(row: Sequence[object]) -> Profile:
    name, sae_id, layer, features, description, created, updated, intensity, bounds = row
    pairs = tuple((int(i), float(s)) for i, s in json.loads(str(features)))
    declared = None if bounds is None else tuple(float(v) for v in json.loads(str(bounds)))
    return Profile(
        name=str(name),
        sae_id=str(sae_id),
        layer=int(str(layer)),
        features=pairs,
        description=str(description),
        created=float(str(created)),
        updated=float(str(updated)),
        intensity=float(str(intensity)),
        intensity_range=None if declared is None else (declared[0], declared[1]),
    )
