"""`X-miLLM-Steering` and inline steering (REQ-000 HDR, GRAM, INL-29, HASH-18/19).

Steering is offered when the server's management API lists an SAE attached
to the model under test (`GET /api/steering`, its `attachments`). The kit
attaches nothing itself: a server with no attachment gets "not offered" for
the inline check. The header grammar check needs only the header itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from ..context import Context
from ..failures import HeaderViolation, NotOffered, SteeringHashMismatch
from ..headers import HeaderGrammarError, Member, parse_steering
from ..registry import check
from ..responses import expect_status
from ..steering_hash import applied_set, clamped_count, steering_set_hash
from .streaming import streamed

STEERING = "X-miLLM-Steering"


@dataclass(frozen=True, slots=True)
class Attachment:
    """An SAE attached at one layer of the model under test."""

    sae_id: str
    layer: int
    d_sae: int


def steering_members(response: httpx.Response, requirement: str) -> list[Member]:
    value = response.headers.get(STEERING)
    if value is None:
        raise HeaderViolation(f"an {STEERING} header", "no such header", requirement)
    try:
        return parse_steering(value)
    except HeaderGrammarError as exc:
        raise HeaderViolation(
            f"{STEERING} in spec/grammar/steering-header.abnf",
            f"{value!r}: {exc}",
            exc.requirement,
        ) from None


@check(
    "OAI-HDR-01",
    "OAI-HDR-05",
    "OAI-HDR-07",
    "OAI-GRAM-01",
    "OAI-GRAM-02",
    "OAI-GRAM-03",
    "OAI-GRAM-04",
    "OAI-GRAM-05",
)
def steering_header_grammar(ctx: Context) -> None:
    """Chat and text completions carry X-miLLM-Steering, an RFC 8941 List in the header grammar."""
    chat = ctx.post("/chat/completions", ctx.chat_body())
    expect_status(chat, 200, "OAI-HDR-05")
    if STEERING not in chat.headers:
        raise NotOffered(f"a chat completion carries no {STEERING} header")
    steering_members(chat, "OAI-HDR-05")
    completion = ctx.post("/completions", ctx.completion_body())
    expect_status(completion, 200, "OAI-HDR-07")
    steering_members(completion, "OAI-HDR-07")


def attachment_of(ctx: Context) -> Attachment:
    """An SAE attached exactly once to the model under test, from GET /api/steering."""
    state = ctx.api_json("/steering")
    if not isinstance(state, dict) or not isinstance(state.get("attachments"), list):
        raise NotOffered(f"GET {ctx.root}/api/steering answers no steering state")
    found = [
        a
        for a in state["attachments"]
        if isinstance(a, dict) and a.get("model", state.get("model")) == ctx.model
    ]
    per_sae: dict[str, list[dict[str, Any]]] = {}
    for entry in found:
        per_sae.setdefault(str(entry.get("sae_id")), []).append(entry)
    for sae_id, entries in per_sae.items():
        entry = entries[0]
        if len(entries) == 1 and isinstance(entry.get("layer"), int):
            return Attachment(sae_id, entry["layer"], int(entry.get("d_sae") or 1))
    raise NotOffered(
        f"no SAE is attached to {ctx.model} at one layer (GET /api/steering); attach one "
        "(POST /api/steering/attachments) to check inline steering"
    )


def _inline_set(attachment: Attachment) -> list[dict[str, Any]]:
    """One plain strength, one past the ±200 clamp, one zero (dropped): indices within d_sae."""
    if attachment.d_sae < 3:
        return [{"index": 0, "strength": 500.0}]
    return [
        {"index": 2, "strength": 6.0},
        {"index": 0, "strength": 500.0},
        {"index": 1, "strength": 0.0},
    ]


def _expect_inline(members: list[Member], attachment: Attachment, sent: list[Any]) -> None:
    pairs = [(f["index"], f["strength"]) for f in sent]
    expected_hash = steering_set_hash(attachment.sae_id, pairs)
    if len(members) != 1 or members[0].kind != "inline":
        raise HeaderViolation("exactly one `inline` member", repr(members), "OAI-INL-29")
    member = members[0]
    want = {
        "sae": attachment.sae_id,
        "layer": attachment.layer,
        "features": len(applied_set(pairs)),
        "clamped": clamped_count(pairs) or None,
    }
    got = {key: member.get(key) for key in want}
    if got != want:
        raise HeaderViolation(f"inline member with {want}", repr(got), "OAI-GRAM-09")
    if member.get("hash") != expected_hash:
        raise SteeringHashMismatch(
            f"hash {expected_hash} (the steering-set hash of {pairs} on {attachment.sae_id})",
            str(member.get("hash")),
            "OAI-HASH-19",
        )


@check(
    "OAI-INL-01",
    "OAI-INL-13",
    "OAI-INL-29",
    "OAI-HASH-01",
    "OAI-HASH-18",
    "OAI-HASH-19",
    "OAI-GRAM-09",
    "OAI-HDR-16",
)
def inline_steering_hash(ctx: Context) -> None:
    """Inline `steering` is reported as one `inline` member whose hash is the kit's own hash of
    the set sent, with the clamp counted; a stream's millm_steering carries the same value."""
    attachment = attachment_of(ctx)
    features = _inline_set(attachment)
    steering = {"sae_id": attachment.sae_id, "features": features}
    response = ctx.post("/chat/completions", ctx.chat_body(max_tokens=2, steering=steering))
    expect_status(response, 200, "OAI-INL-01")
    _expect_inline(steering_members(response, "OAI-INL-29"), attachment, features)
    body = ctx.chat_body(max_tokens=2, steering=steering, stream=True)
    _, stream = streamed(ctx, "/chat/completions", body)
    values = [c["millm_steering"] for c in stream.chunks if "millm_steering" in c]
    if values != [response.headers[STEERING]]:
        raise HeaderViolation(
            f"millm_steering byte-identical to the header {response.headers[STEERING]!r}",
            repr(values),
            "OAI-HDR-16",
        )
