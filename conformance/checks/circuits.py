"""Clusters and circuits: X-miLLM-Circuit-Rung and the hashes of what they apply
(REQ-000 RUNG, CIRCUIT, DIAL, HASH; issue 19).

Circuits are offered when `GET /api/circuits/active` lists an active circuit
that steers the model under test (`steering: true`); the kit activates
nothing itself. Clusters (profiles) are offered when `GET /api/profiles` lists
one whose SAE is attached at its layer of the model under test. Every hash is
recomputed with the kit's own steering-set hash from the documents the
server serves: a circuit's members and its resolved λ, a profile's stored
strengths and the λ its header member reports.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..context import Context
from ..failures import BodyShapeViolation, HeaderViolation, NotOffered, SteeringHashMismatch
from ..headers import HeaderGrammarError, Member, parse_rung
from ..registry import check
from ..responses import expect_status
from ..steering_hash import applied_set, clamped_count, steering_set_hash
from .steering import STEERING, steering_members

RUNG = "X-miLLM-Circuit-Rung"


def _active(ctx: Context) -> dict[str, Any]:
    """GET /api/circuits/active, when at least one circuit steers the model under test."""
    state = ctx.api_json("/circuits/active")
    if not isinstance(state, dict) or not isinstance(state.get("circuits"), list):
        raise NotOffered(f"GET {ctx.root}/api/circuits/active answers no circuits state")
    if state.get("model") != ctx.model or not any(
        isinstance(c, dict) and c.get("steering") is True for c in state["circuits"]
    ):
        raise NotOffered(
            f"no active circuit steers {ctx.model} (GET /api/circuits/active); import and "
            "activate one (POST /api/circuits, PUT /api/circuits/{id}/active) to have it checked"
        )
    return state


def _rung_of(response: httpx.Response) -> int | None:
    value = response.headers.get(RUNG)
    if value is None:
        return None
    try:
        return parse_rung(value)[0]
    except HeaderGrammarError as exc:
        raise HeaderViolation(
            f"{RUNG} in spec/grammar/circuit-rung-header.abnf", f"{value!r}: {exc}", exc.requirement
        ) from None


def _circuits(members: list[Member]) -> dict[str, float]:
    return {str(m.get("id")): float(m.get("intensity")) for m in members if m.kind == "circuit"}


@check(
    "OAI-RUNG-01",
    "OAI-RUNG-02",
    "OAI-RUNG-05",
    "OAI-RUNG-06",
    "OAI-RUNG-07",
    "OAI-RUNG-08",
    "OAI-RUNG-13",
    "OAI-RUNG-14",
    "OAI-RUNG-16",
    "OAI-RUNG-17",
    "OAI-RUNG-18",
    "OAI-GRAM-11",
    "OAI-GRAM-12",
)
def circuit_rung_header(ctx: Context) -> None:
    """With a circuit steering, a chat names it in one `circuit` member and carries
    X-miLLM-Circuit-Rung in the rung grammar, the lowest rung of the circuits named, equal to
    `steering` of GET /api/circuits/active; dialled off, or steered inline, no rung header."""
    state = _active(ctx)
    response = ctx.post("/chat/completions", ctx.chat_body(max_tokens=2))
    expect_status(response, 200, "OAI-RUNG-01")
    named = _circuits(steering_members(response, "OAI-GRAM-11"))
    rung = _rung_of(response)
    evidence = state.get("steering")
    expected = evidence.get("header") if isinstance(evidence, dict) else None
    if response.headers.get(RUNG) is not None and not named:
        raise HeaderViolation(
            f"{RUNG} only with a `circuit` member in {STEERING}",
            f"{RUNG}: {response.headers[RUNG]!r} beside {response.headers.get(STEERING)!r}",
            "OAI-RUNG-16",
        )
    if expected is not None and response.headers.get(RUNG) is None:
        raise HeaderViolation(
            f"{RUNG}: {expected!r} (GET /api/circuits/active `steering`)",
            "no header",
            "OAI-RUNG-01",
        )
    if rung is not None:
        rungs = {
            c.get("id"): c.get("rung")
            for c in state["circuits"]
            if isinstance(c, dict) and c.get("id") in named
        }
        lowest = min((r for r in rungs.values() if isinstance(r, int)), default=None)
        if rung != lowest:
            raise HeaderViolation(
                f"rung {lowest}, the lowest of the circuits named ({rungs})",
                str(rung),
                "OAI-RUNG-17",
            )
        if expected is None or parse_rung(expected)[0] != rung:
            raise HeaderViolation(
                f"GET /api/circuits/active `steering` agreeing with {response.headers[RUNG]!r}",
                repr(evidence),
                "OAI-RUNG-18",
            )
    off = ctx.post("/chat/completions", ctx.chat_body(max_tokens=2, steering_intensity="off"))
    expect_status(off, 200, "OAI-RUNG-13")
    if RUNG in off.headers or _circuits(steering_members(off, "OAI-RUNG-13")):
        raise HeaderViolation(
            f'no `circuit` member and no {RUNG} at steering_intensity "off"',
            f"{off.headers.get(STEERING)!r}, {RUNG}: {off.headers.get(RUNG)!r}",
            "OAI-RUNG-13",
        )
    inline = ctx.post("/chat/completions", ctx.chat_body(max_tokens=2, steering={"features": []}))
    expect_status(inline, 200, "OAI-RUNG-14")
    if RUNG in inline.headers:
        raise HeaderViolation(
            f"no {RUNG} with inline `steering`", inline.headers[RUNG], "OAI-RUNG-14"
        )


def _document_members(ctx: Context, circuit_id: str) -> list[dict[str, Any]]:
    view = ctx.api_json(f"/circuits/{circuit_id}")
    document = view.get("document") if isinstance(view, dict) else None
    members = document.get("members") if isinstance(document, dict) else None
    if not isinstance(members, list):
        raise BodyShapeViolation(
            f"GET /api/circuits/{circuit_id} with its mi.circuit/v1 `document`",
            repr(view)[:300],
            "OAI-CIRCUIT-01",
        )
    return [m for m in members if isinstance(m, dict)]


def _expect_layer(circuit_id: str, layer: dict[str, Any], scaled: list[tuple[int, float]]) -> None:
    sae_id = str(layer.get("sae_id"))
    want = {
        "features": len(applied_set(scaled)),
        "clamped": clamped_count(scaled),
        "hash": steering_set_hash(sae_id, scaled),
    }
    got = {key: layer.get(key) for key in want}
    if got["hash"] != want["hash"]:
        raise SteeringHashMismatch(
            f"{circuit_id} at ({sae_id}, layer {layer.get('layer')}): {want['hash']}, the kit's "
            f"hash of clamp(authored x λ) = {scaled}",
            str(got["hash"]),
            "OAI-CIRCUIT-09",
        )
    if got != want:
        raise BodyShapeViolation(f"{circuit_id} layer entry {want}", repr(got), "OAI-CIRCUIT-09")


@check("OAI-CIRCUIT-01", "OAI-CIRCUIT-02", "OAI-CIRCUIT-08", "OAI-CIRCUIT-09", "OAI-HASH-02")
def circuit_member_hash(ctx: Context) -> None:
    """Each active circuit's (SAE, layer) entries in GET /api/circuits/active carry the kit's
    own steering-set hash of clamp(authored strength × resolved λ) over the members of its
    document at that SAE and layer; a chat names each steering circuit at that λ."""
    state = _active(ctx)
    response = ctx.post("/chat/completions", ctx.chat_body(max_tokens=2))
    expect_status(response, 200, "OAI-CIRCUIT-01")
    named = _circuits(steering_members(response, "OAI-GRAM-11"))
    for circuit in state["circuits"]:
        if not isinstance(circuit, dict) or circuit.get("mode") != "circuit":
            continue
        circuit_id, lam = str(circuit.get("id")), circuit.get("resolved_intensity")
        if not isinstance(lam, int | float) or circuit.get("error") is not None:
            continue
        members = _document_members(ctx, circuit_id)
        for layer in circuit.get("layers") or []:
            at = (layer.get("sae_id"), layer.get("layer"))
            scaled = [
                (int(m["index"]), float(m["strength"]) * float(lam))
                for m in members
                if (m.get("sae_id"), m.get("layer")) == at
            ]
            _expect_layer(circuit_id, layer, scaled)
        if circuit.get("steering") is True and named.get(circuit_id) != float(lam):
            raise HeaderViolation(
                f'circuit;id="{circuit_id}";intensity="{float(lam)!r}" in {STEERING}',
                repr(response.headers.get(STEERING)),
                "OAI-CIRCUIT-01",
            )


def _cluster(ctx: Context) -> dict[str, Any]:
    """A stored profile whose SAE is attached at its layer of the model under test."""
    steering = ctx.api_json("/steering")
    profiles = ctx.api_json("/profiles")
    if not isinstance(steering, dict) or not isinstance(profiles, dict):
        raise NotOffered(f"GET {ctx.root}/api/steering or /api/profiles answers no state")
    attached = {
        (a.get("sae_id"), a.get("layer"))
        for a in steering.get("attachments") or []
        if isinstance(a, dict) and a.get("model", steering.get("model")) == ctx.model
    }
    for profile in profiles.get("data") or []:
        if isinstance(profile, dict) and (profile.get("sae_id"), profile.get("layer")) in attached:
            return profile
    raise NotOffered(
        f"no stored profile (cluster) names an SAE attached to {ctx.model} at its layer; import "
        "one (POST /api/clusters) to have it checked"
    )


@check("OAI-DIAL-01", "OAI-HASH-06", "OAI-HASH-19", "OAI-GRAM-08", "OAI-PROF-08")
def cluster_member_hash(ctx: Context) -> None:
    """A request naming a stored cluster (`profile`) with a dial gets one `profile` member,
    source=request, whose hash is the kit's hash of clamp(stored × λ) at the λ it reports."""
    profile = _cluster(ctx)
    body = ctx.chat_body(max_tokens=2, profile=profile["name"], steering_intensity=0.75)
    response = ctx.post("/chat/completions", body)
    expect_status(response, 200, "OAI-DIAL-01")
    members = [m for m in steering_members(response, "OAI-GRAM-08") if m.kind == "profile"]
    if len(members) != 1 or members[0].get("source") != "request":
        raise HeaderViolation(
            f"one `profile` member for {profile['name']!r}, source=request",
            repr(response.headers.get(STEERING)),
            "OAI-PROF-08",
        )
    member = members[0]
    lam = float(member.get("intensity"))
    scaled = [
        (int(f["index"]), float(f["strength"]) * lam)
        for f in profile.get("features") or []
        if isinstance(f, dict)
    ]
    want = steering_set_hash(str(profile["sae_id"]), scaled)
    if member.get("hash") != want:
        raise SteeringHashMismatch(
            f"{want}, the kit's hash of clamp(stored x {lam!r}) = {scaled}",
            str(member.get("hash")),
            "OAI-HASH-06",
        )
    if member.get("features") != len(applied_set(scaled)):
        raise HeaderViolation(
            f"features={len(applied_set(scaled))}", str(member.get("features")), "OAI-GRAM-08"
        )
