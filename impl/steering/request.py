"""A request's own steering: `profile`, `steering_intensity`, inline `steering`.

`resolve_steering()` turns the three fields into what the request runs under,
against the live state, or refuses with the documented 4xx:

    steering       the given set on one attached SAE, every other SAE off
                   (OAI-INL); `features: []` is explicitly unsteered
    profile        the named profile replaces the global state (OAI-PROF),
                   scaled by the request's λ or the profile's stored dial
    λ only         the bases (active profile, active circuits) re-derived at
                   λ, else the live values scaled by λ; other live values
                   stay as they are (OAI-DIAL-10, OAI-CIRCUIT-01)
    λ = 0 / "off"  unsteered, the base not validated (OAI-DIAL-11)
    nothing        the global state, as the operator leaves it

The result's `override` is None when the request follows the global state;
`echo` is the λ for X-miLLM-Steering-Intensity, or None where OAI-SINT
says the header is omitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ApiError, InvalidParameter
from ..store.profiles import Profile, ProfileNotFound
from . import dial
from .applied import EMPTY, AppliedSAE, Snapshot, applied_sae, snapshot
from .live import Attachment, LiveSteering, check_strengths


@dataclass(frozen=True, slots=True)
class InlineSet:
    """The inline `steering` object: an optional SAE id and (index, strength) pairs."""

    sae_id: str | None
    features: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class SteeringAsk:
    """The steering fields of one request (None: not sent)."""

    profile: str | None = None
    intensity: dial.Dial | None = None
    inline: InlineSet | None = None

    def __bool__(self) -> bool:
        return self.profile is not None or self.intensity is not None or self.inline is not None


@dataclass(frozen=True, slots=True)
class Resolution:
    override: Snapshot | None
    echo: float | None = None


def resolve_steering(
    ask: SteeringAsk, live: LiveSteering, model_id: str, resident: bool
) -> Resolution:
    """What the request runs under; refusals raise ApiError before any generation.

    `resident` says whether `model_id` is the resident model (an SAE steers
    only the resident model: OAI-INL-23).
    """
    _exclusive(ask)
    attached = live.attachments(model_id) if resident else []
    if ask.inline is not None:
        return Resolution(_inline(ask.inline, attached))
    if dial.is_off(ask.intensity):
        return Resolution(EMPTY, _off_echo(ask, live, attached))
    if ask.profile is not None:
        return _profile(ask, live, model_id, attached)
    if ask.intensity is not None:
        return _dialled(ask.intensity, live, model_id, attached)
    return Resolution(None)


def _exclusive(ask: SteeringAsk) -> None:
    if ask.inline is None:
        return
    for other, value in (("profile", ask.profile), ("steering_intensity", ask.intensity)):
        if value is not None:
            raise InvalidParameter(
                "steering",
                f"`steering` and `{other}` cannot be combined: send one of them (OAI-INL-19/20).",
            )


def _inline(inline: InlineSet, attached: Sequence[Attachment]) -> Snapshot:
    if not inline.features:
        if inline.sae_id is not None:
            raise InvalidParameter(
                "steering.sae_id",
                "`steering.sae_id` with an empty `features` list is refused: "
                "`features: []` means unsteered on every SAE.",
            )
        return EMPTY
    strengths = _strengths(inline.features)
    target = _target(inline.sae_id, attached)
    for j, (index, strength) in enumerate(inline.features):
        check_strengths(target.sae, {index: strength}, f"steering.features[{j}].index")
    return snapshot([applied_sae("inline", target.sae, target.layer, strengths)])


def _strengths(features: Sequence[tuple[int, float]]) -> dict[int, float]:
    strengths: dict[int, float] = {}
    for j, (index, strength) in enumerate(features):
        if isinstance(strength, bool) or not math.isfinite(float(strength)):
            raise InvalidParameter(
                f"steering.features[{j}].strength",
                f"The strength of feature {index} must be a finite number.",
            )
        if index in strengths:
            raise InvalidParameter(
                f"steering.features[{j}].index", f"Feature index {index} is listed twice."
            )
        strengths[index] = float(strength)
    return strengths


def _pairs(attachments: Sequence[Attachment]) -> str:
    return ", ".join(f"({a.sae.sae_id}, layer {a.layer})" for a in attachments)


def _target(sae_id: str | None, attached: Sequence[Attachment]) -> Attachment:
    if not attached:
        raise ApiError(
            "SAE_NOT_ATTACHED",
            "No SAE is attached to this request's model (it must be the resident model); "
            "attach one with POST /api/steering/attachments.",
            "steering",
        )
    found = [a for a in attached if sae_id in (None, a.sae.sae_id)]
    if not found:
        raise ApiError(
            "SAE_NOT_ATTACHED",
            f"SAE `{sae_id}` is not attached (attached: {_pairs(attached)}).",
            "steering.sae_id",
        )
    if len(found) > 1:
        raise InvalidParameter(
            "steering.sae_id",
            f"Which SAE? Attached: {_pairs(found)}; name one with `steering.sae_id` "
            "(an SAE attached at two layers cannot be steered inline).",
        )
    return found[0]


def _find(live: LiveSteering, name: str) -> Profile:
    try:
        return live.profiles.get(name)
    except ProfileNotFound:
        raise ApiError("profile_not_found", f"No profile named `{name}`.", "profile") from None


def _off_echo(ask: SteeringAsk, live: LiveSteering, attached: Sequence[Attachment]) -> float | None:
    """λ=0 echoes 0.0 only for a known profile with an SAE attached (OAI-SINT-03)."""
    if ask.profile is None or not attached:
        return None
    try:
        live.profiles.get(ask.profile)
    except ProfileNotFound:
        return None
    return 0.0


def _profile(
    ask: SteeringAsk, live: LiveSteering, model_id: str, attached: Sequence[Attachment]
) -> Resolution:
    assert ask.profile is not None
    profile = _find(live, ask.profile)
    if not attached:
        return Resolution(EMPTY)  # OAI-PROF-06: no SAE attached runs unsteered
    target = next((a for a in attached if a.pair == (profile.sae_id, profile.layer)), None)
    if target is None:
        raise InvalidParameter(
            "profile",
            f"Profile `{profile.name}` steers SAE `{profile.sae_id}` at layer {profile.layer}, "
            f"which is not attached (attached: {_pairs(attached)}).",
        )
    for index, _ in profile.features:
        if not 0 <= index < target.sae.d_sae:
            raise InvalidParameter(
                "profile",
                f"Profile `{profile.name}` names feature {index}, outside "
                f"0..{target.sae.d_sae - 1} of SAE `{profile.sae_id}`.",
            )
    applied = live.profile_applied_sae(
        profile, model_id, "request", _number(ask.intensity, profile, live)
    )
    assert applied is not None
    echo = applied.intensity if ask.intensity is not None else None
    return Resolution(snapshot([applied]), echo)


def _number(value: dial.Dial | None, profile: Profile, live: LiveSteering) -> float | None:
    if value is None:
        return None
    return dial.cluster_lambda(value, dial.Bounds.of(profile.intensity_range, live.bounds))


def _dialled(
    value: dial.Dial, live: LiveSteering, model_id: str, attached: Sequence[Attachment]
) -> Resolution:
    """λ without a profile re-derives every base at λ (the active profile, the active
    circuits, each by its own rule); without a base it scales the live values."""
    if not attached:
        return Resolution(None)
    based = live.dialled(model_id, value)
    if based is not None:
        return Resolution(based.snapshot, based.echo)
    _, current = live.read(model_id)
    if not current.items:
        return Resolution(None)
    lam = dial.cluster_lambda(value, live.bounds)
    items: list[AppliedSAE] = [
        applied_sae("manual", i.sae, i.layer, dict(i.applied), scale=lam) for i in current.items
    ]
    return Resolution(snapshot(items, current.unreadable), lam)
