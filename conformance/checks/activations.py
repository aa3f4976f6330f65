"""Per-request SAE activations, `return_sae_activations` (REQ-000 ACT, STREAM-09).

Offered when an SAE is attached to the model under test (`GET /api/steering`)
and the server does not refuse the field as not honoured (`400
field_not_honoured`, e.g. a GGUF model): otherwise "not offered".
"""

from __future__ import annotations

from typing import Any

from ..context import Context
from ..failures import BodyShapeViolation, NotOffered, StreamFramingViolation
from ..registry import check
from ..responses import api_error, expect_status, field, json_object
from .steering import Attachment, attachment_of
from .streaming import streamed

FIELD = "return_sae_activations"
TOP_K = 2


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, repr(received)[:400], requirement)


def _reading(ctx: Context, body: dict[str, Any]) -> dict[str, Any]:
    """The 200 body of a request asking for activations, or NotOffered."""
    response = ctx.post("/chat/completions", body)
    if response.status_code == 400 and api_error(response).code == "field_not_honoured":
        raise NotOffered(f"`{FIELD}` is refused: {api_error(response).message}")
    expect_status(response, 200, "OAI-ACT-01")
    return json_object(response, "OAI-ACT-02")


def _expect_positions(reading: dict[str, Any], attachment: Attachment, expected: list[int]) -> None:
    positions = field(reading, "positions", "OAI-ACT-12")
    _expect(
        isinstance(positions, list) and [p.get("position") for p in positions] == expected,
        f"positions {expected} (prompt then completion, the last sampled token never read)",
        positions,
        "OAI-ACT-05",
    )
    for entry in positions:
        features = entry.get("features")
        _expect(
            isinstance(entry.get("token_id"), int)
            and isinstance(features, list)
            and len(features) <= TOP_K
            and all(
                isinstance(f.get("index"), int)
                and 0 <= f["index"] < attachment.d_sae
                and isinstance(f.get("value"), int | float)
                for f in features
            ),
            f"a token_id and at most {TOP_K} features {{index < d_sae, value}}",
            entry,
            "OAI-ACT-08",
        )
        values = [f["value"] for f in features]
        _expect(values == sorted(values, reverse=True), "largest first", values, "OAI-ACT-08")


@check(
    "OAI-ACT-01",
    "OAI-ACT-02",
    "OAI-ACT-04",
    "OAI-ACT-05",
    "OAI-ACT-06",
    "OAI-ACT-08",
    "OAI-ACT-09",
    "OAI-ACT-12",
    "OAI-ACT-13",
    "OAI-ACT-15",
)
def activations_reply(ctx: Context) -> None:
    """A chat asking for `positions: all` gets `millm.sae_activations` of the attached SAE:
    every position fed (prompt + completion - 1), top_k largest first; no `millm` unasked."""
    attachment = attachment_of(ctx)
    ask = {"sae_id": attachment.sae_id, "positions": "all", "top_k": TOP_K}
    body = _reading(ctx, ctx.chat_body(max_tokens=3, **{FIELD: ask}))
    reading = field(body, "millm.sae_activations", "OAI-ACT-02")
    got = {k: reading.get(k) for k in ("sae_id", "layer", "read_point")}
    want = {"sae_id": attachment.sae_id, "layer": attachment.layer, "read_point": "post_steering"}
    _expect(got == want, str(want), got, "OAI-ACT-09")
    _expect(isinstance(reading.get("note"), str), "a `note`", reading, "OAI-ACT-13")
    usage = field(body, "usage", "OAI-RESP-05")
    fed = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    _expect_positions(reading, attachment, list(range(fed)))
    plain = json_object(ctx.post("/chat/completions", ctx.chat_body(max_tokens=2)))
    _expect("millm" not in plain, "no `millm` key when not asked", plain, "OAI-ACT-15")


@check("OAI-ACT-14", "OAI-STREAM-09")
def activations_stream_chunk(ctx: Context) -> None:
    """Streamed, the activations come on one `choices: []` chunk after the choices' chunks and
    before the last chunk (`millm_steering`) and [DONE]."""
    attachment = attachment_of(ctx)
    ask = {"sae_id": attachment.sae_id, "positions": "last", "top_k": TOP_K}
    body = ctx.chat_body(max_tokens=3, stream=True, **{FIELD: ask})
    response = ctx.post("/chat/completions", body)
    if response.status_code == 400 and api_error(response).code == "field_not_honoured":
        raise NotOffered(f"`{FIELD}` is refused: {api_error(response).message}")
    _, stream = streamed(ctx, "/chat/completions", body)
    carrying = [i for i, chunk in enumerate(stream.chunks) if "millm" in chunk]
    last_choice = max((i for i, c in enumerate(stream.chunks) if c["choices"]), default=-1)
    steering = [i for i, chunk in enumerate(stream.chunks) if "millm_steering" in chunk]
    if (
        len(carrying) != 1
        or stream.chunks[carrying[0]]["choices"] != []
        or carrying[0] < last_choice
        or (steering and carrying[0] > steering[0])
    ):
        raise StreamFramingViolation(
            "one `choices: []` chunk with `millm`, after the choices, before millm_steering",
            f"millm on chunks {carrying} of {len(stream.chunks)}",
            "OAI-ACT-14",
        )
