"""OpenAI's Responses API, `/v1/responses` (the contract's own MIS-RESPONSES, 0.20.0).

REQ-000 predates the route; the contract serves it and names what a client may rely on in
docs/CONFORMANCE.md. A Response is `{id: "resp_...", object: "response", status, output,
usage}` in the Responses API's own names; a stored one is read back as answered, its input
listed, continued by `previous_response_id` and deleted; a stream is typed events, each
`event: <type>` with a `sequence_number` counting from 0, ending with the final Response.
A server that answers 404 on the route does not offer it.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..context import Context
from ..events import typed_events
from ..failures import BodyShapeViolation, NotOffered, StreamFramingViolation
from ..registry import check
from ..responses import expect_error, expect_status, is_int, json_object

SHAPE = "MIS-RESPONSES-01"
STORED = "MIS-RESPONSES-02"
CONTINUED = "MIS-RESPONSES-03"
EVENTS = "MIS-RESPONSES-04"
SAID = "Say hello."
ENDED = ("completed", "incomplete")
LAST_EVENTS = ("response.completed", "response.incomplete")


def _cut(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, _cut(received), requirement)


def _body(ctx: Context, **fields: Any) -> dict[str, Any]:
    """A short greedy response request for the model under test."""
    return {"model": ctx.model, "input": SAID, "max_output_tokens": 4, "temperature": 0} | fields


def _created(ctx: Context, body: dict[str, Any]) -> httpx.Response:
    response = ctx.post("/responses", body)
    if response.status_code == 404:
        raise NotOffered("POST /responses answered 404: the server has no Responses API")
    expect_status(response, 200, SHAPE)
    return response


def _text(response: dict[str, Any]) -> str:
    """The output text of a Response: its message items' `output_text` parts, joined."""
    parts = [
        part
        for item in response.get("output") or ()
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]
    return "".join(str(part.get("text")) for part in parts)


def _shape(body: dict[str, Any], requirement: str = SHAPE) -> None:
    """A Response in OpenAI's shape, with one assistant message of `output_text`."""
    _expect(
        isinstance(body.get("id"), str) and body["id"].startswith("resp_"),
        'an `id` starting "resp_"',
        body.get("id"),
        requirement,
    )
    _expect(
        body.get("object") == "response", '`object` "response"', body.get("object"), requirement
    )
    _expect(is_int(body.get("created_at")), "`created_at` an integer", body, requirement)
    _expect(body.get("status") in ENDED, '`status` "completed" or "incomplete"', body, requirement)
    if body["status"] == "incomplete":
        details = body.get("incomplete_details")
        _expect(
            isinstance(details, dict) and isinstance(details.get("reason"), str),
            "`incomplete_details.reason` on an incomplete response",
            details,
            requirement,
        )
    messages = [
        item
        for item in body.get("output") or ()
        if isinstance(item, dict) and item.get("type") == "message"
    ]
    _expect(
        len(messages) == 1
        and messages[0].get("role") == "assistant"
        and isinstance(messages[0].get("id"), str)
        and any(
            isinstance(part, dict)
            and part.get("type") == "output_text"
            and isinstance(part.get("text"), str)
            for part in messages[0].get("content") or ()
        ),
        "`output` with one assistant message item carrying `output_text` parts",
        body.get("output"),
        requirement,
    )
    _usage(body.get("usage"), requirement)


def _usage(usage: Any, requirement: str) -> dict[str, Any]:
    """`{input_tokens, output_tokens, total_tokens = input + output, input_tokens_details:
    {cached_tokens}, output_tokens_details: {reasoning_tokens}}`."""
    ok = isinstance(usage, dict)
    counts = [usage.get(k) for k in ("input_tokens", "output_tokens", "total_tokens")] if ok else []
    ok = ok and all(is_int(c) and c >= 0 for c in counts) and counts[0] + counts[1] == counts[2]
    cached = usage.get("input_tokens_details") if ok else None
    reasoning = usage.get("output_tokens_details") if ok else None
    ok = (
        isinstance(cached, dict)
        and is_int(cached.get("cached_tokens"))
        and isinstance(reasoning, dict)
        and is_int(reasoning.get("reasoning_tokens"))
    )
    _expect(
        ok,
        "usage {input_tokens, output_tokens, total_tokens = input + output, "
        "input_tokens_details.cached_tokens, output_tokens_details.reasoning_tokens}",
        usage,
        requirement,
    )
    result: dict[str, Any] = usage
    return result


@check("MIS-RESPONSES-01", "MIS-RESPONSES-02", "MIS-RESPONSES-03")
def response_object_shape(ctx: Context) -> None:
    """A Response in OpenAI's shape; stored, read back, listed, continued and deleted."""
    first = json_object(_created(ctx, _body(ctx)), SHAPE)
    _shape(first)
    made = [first["id"]]
    try:
        again = ctx.get(f"/responses/{first['id']}")
        expect_status(again, 200, STORED)
        _expect(json_object(again, STORED) == first, "the Response as answered", again.text, STORED)
        listed = json_object(ctx.get(f"/responses/{first['id']}/input_items"), STORED)
        data = listed.get("data")
        _expect(
            listed.get("object") == "list"
            and isinstance(data, list)
            and len(data) == 1
            and isinstance(data[0], dict)
            and data[0].get("type") == "message"
            and data[0].get("role") == "user"
            and data[0].get("content") == [{"type": "input_text", "text": SAID}]
            and listed.get("has_more") is False,
            '`{"object": "list", "data": [the input as one user message of input_text], '
            '"has_more": false}`',
            listed,
            STORED,
        )
        second = _created(ctx, _body(ctx, previous_response_id=first["id"], input="Again."))
        turn = json_object(second, CONTINUED)
        made.append(turn.get("id"))
        _shape(turn, CONTINUED)
        seen = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
        _expect(
            turn.get("previous_response_id") == first["id"]
            and turn["usage"]["input_tokens"] > seen,
            "the previous response's id echoed, and more `input_tokens` than the first turn's "
            f"input and output ({seen})",
            turn,
            CONTINUED,
        )
    finally:
        deleted = [_delete(ctx, response_id) for response_id in made]
    _expect(
        deleted == [{"id": i, "object": "response", "deleted": True} for i in made],
        '`{"id", "object": "response", "deleted": true}` from each DELETE',
        deleted,
        STORED,
    )
    gone = ctx.get(f"/responses/{first['id']}")
    expect_error(gone, 404, "response_not_found", STORED)
    orphan = ctx.post("/responses", _body(ctx, previous_response_id=first["id"]))
    error = expect_error(orphan, 400, "previous_response_not_found", CONTINUED)
    _expect(
        error.param == "previous_response_id",
        "`param` previous_response_id",
        error.param,
        CONTINUED,
    )


def _delete(ctx: Context, response_id: str) -> Any:
    """DELETE a stored response (labelled JSON, as a cross-site form cannot send it)."""
    headers = {"Content-Type": "application/json"}
    response = ctx.client.delete(f"{ctx.base_url}/responses/{response_id}", headers=headers)
    try:
        return response.json()
    except ValueError:
        return response.text


@check("MIS-RESPONSES-04")
def response_stream_events(ctx: Context) -> None:
    """A streamed Response is typed events numbered from 0, ending with the final Response."""
    response = _created(ctx, _body(ctx, stream=True, store=False))
    kind = response.headers.get("content-type", "")
    if not kind.startswith("text/event-stream"):
        raise StreamFramingViolation("Content-Type text/event-stream", kind, EVENTS)
    events = typed_events(response.text, EVENTS)
    kinds = [event["type"] for event in events]
    numbers = [event.get("sequence_number") for event in events]
    if numbers != list(range(len(events))):
        raise StreamFramingViolation(
            "`sequence_number` 0, 1, 2, ... on the events in order", _cut(numbers), EVENTS
        )
    if kinds[:2] != ["response.created", "response.in_progress"] or kinds[-1] not in LAST_EVENTS:
        raise StreamFramingViolation(
            "response.created, response.in_progress first; response.completed or "
            "response.incomplete last",
            _cut(kinds),
            EVENTS,
        )
    final = events[-1].get("response")
    if not isinstance(final, dict):
        raise BodyShapeViolation("the final event's `response`", _cut(events[-1]), EVENTS)
    _shape(final, EVENTS)
    deltas = "".join(
        str(e.get("delta")) for e in events if e["type"] == "response.output_text.delta"
    )
    done = [e.get("text") for e in events if e["type"] == "response.output_text.done"]
    _expect(
        done == [deltas] and _text(final) == deltas,
        "the output_text deltas joined = the one response.output_text.done `text` = the final "
        "Response's text",
        {"deltas": deltas, "done": done, "final": _text(final)},
        EVENTS,
    )
