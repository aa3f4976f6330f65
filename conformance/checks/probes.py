"""Probe verdicts on chat and text completions (REQ-000 PROBE, STREAM-09).

Offered when `GET /api/probes` lists an armed probe: every chat and text
completion must then say what each armed probe found. Otherwise (no such
route, nothing armed) "not offered". The result vocabularies are the
contract's (`ProbeResult` in v1.yaml, published as mi-probe-result-v1.json).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from http_sfv.item import Item
from http_sfv.list import List as SfList
from http_sfv.types import Token

from ..context import Context
from ..failures import BodyShapeViolation, HeaderViolation, NotOffered, StreamFramingViolation
from ..registry import check
from ..responses import expect_status, json_object
from .streaming import streamed

HEADER = "X-miLLM-Probe-Verdicts"
MEMBER = "millm_probe_verdicts"
WINDOWS = ("last_user", "prompt", "completion")
OUTCOMES = ("scored", "interrupted", "skipped")
VERDICTS = ("flagged", "clear", "none")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TRACE = re.compile(r"[0-9a-f]{32}")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _expect(ok: bool, expected: str, received: Any, requirement: str) -> None:
    if not ok:
        raise BodyShapeViolation(expected, repr(received)[:400], requirement)


def armed_of(ctx: Context) -> list[str]:
    """The names of the armed probes (GET /api/probes), or NotOffered."""
    listed = ctx.api_json("/probes")
    data = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(data, list):
        raise NotOffered(f"GET {ctx.root}/api/probes answers no list of probes")
    names = sorted(str(p.get("name")) for p in data if isinstance(p, dict) and p.get("armed"))
    if not names:
        raise NotOffered("no probe is armed (GET /api/probes); arm one to check verdicts")
    return names


def _result(result: Any) -> None:
    """One `mi.probe.result/v1` object's keys and vocabularies."""
    _expect(isinstance(result, dict), "an object per result", result, "OAI-PROBE-05")
    for key in ("result_id", "outcome", "reason"):
        _expect(isinstance(result.get(key), str), f"`{key}`", result, "OAI-PROBE-10")
    _expect(result.get("schema") == "mi.probe.result/v1", "schema", result, "OAI-PROBE-05")
    _expect(result.get("outcome") in OUTCOMES, f"outcome in {OUTCOMES}", result, "OAI-PROBE-10")
    for key in ("detector_digest", "decision_digest"):
        ok = DIGEST.fullmatch(str(result.get(key)))
        _expect(bool(ok), f"`{key}` sha256:<hex>", result, "OAI-PROBE-11")
    served = result.get("served")
    _expect(
        isinstance(served, dict)
        and all(isinstance(served.get(k), str) for k in ("backend", "engine", "model")),
        "`served` {backend, engine, model}",
        result,
        "OAI-PROBE-12",
    )
    score = result.get("score")
    _expect(
        (score is None or isinstance(score, int | float))
        and isinstance(result.get("threshold"), int | float)
        and result.get("verdict") in VERDICTS,
        f"`score` (number or null), `threshold`, `verdict` in {VERDICTS}",
        result,
        "OAI-PROBE-13",
    )
    _expect(
        result.get("name") == result.get("probe") and isinstance(result.get("scored"), bool),
        "the legacy `name` (the probe) and `scored` (boolean)",
        result,
        "OAI-PROBE-14",
    )
    _expect(result.get("window") in WINDOWS, f"window in {WINDOWS}", result, "OAI-PROBE-05")
    _expect(bool(TRACE.fullmatch(str(result.get("trace_id")))), "trace_id", result, "OAI-PROBE-15")


def _header(response: httpx.Response) -> list[tuple[str, str, str, str, int]]:
    """X-miLLM-Probe-Verdicts as (name, window, verdict, reason, index) entries."""
    value = response.headers.get(HEADER)
    if value is None:
        raise HeaderViolation(f"an {HEADER} header", "none", "OAI-PROBE-02")
    parsed = SfList()
    try:
        parsed.parse(value.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise HeaderViolation("an RFC 8941 List", value[:300], "OAI-PROBE-02") from exc
    entries = []
    for item in parsed:
        params = dict(item.params) if isinstance(item, Item) else {}
        reason = params.get("reason")
        if not isinstance(item, Item) or not isinstance(item.value, str):
            raise HeaderViolation("String items (probe names)", value[:300], "OAI-PROBE-02")
        if not isinstance(reason, Token):
            raise HeaderViolation("a Token `reason` (a code)", value[:300], "OAI-PROBE-04")
        entries.append(
            (
                item.value,
                str(params.get("window")),
                str(params.get("verdict")),
                str(reason),
                int(params.get("index", 0)),
            )
        )
    order = [(name, window, index) for name, window, _, _, index in entries]
    if order != sorted(order):
        raise HeaderViolation("entries sorted by name, then window", value[:300], "OAI-PROBE-03")
    return entries


def _verdicts(ctx: Context, path: str, body: dict[str, Any], names: list[str]) -> None:
    response = ctx.post(path, body)
    expect_status(response, 200, "OAI-PROBE-01")
    reply = json_object(response, "OAI-PROBE-05")
    found_results = reply.get(MEMBER)
    ok = isinstance(found_results, list) and bool(found_results)
    _expect(ok, f"a non-empty `{MEMBER}` list", reply, "OAI-PROBE-05")
    results: list[Any] = found_results or []
    for result in results:
        _result(result)
    found = sorted({r["probe"] for r in results})
    _expect(found == names, f"every armed probe: {names}", found, "OAI-PROBE-01")
    entries = _header(response)
    listed = sorted(
        (r["probe"], r["window"], r["verdict"], r["reason"], int(r.get("index", 0)))
        for r in results
    )
    if sorted(entries) != listed:
        raise HeaderViolation(
            f"one header entry per body result: {listed}", str(entries)[:300], "OAI-PROBE-02"
        )


@check(
    "OAI-PROBE-01",
    "OAI-PROBE-02",
    "OAI-PROBE-03",
    "OAI-PROBE-04",
    "OAI-PROBE-05",
    "OAI-PROBE-10",
    "OAI-PROBE-11",
    "OAI-PROBE-12",
    "OAI-PROBE-13",
    "OAI-PROBE-14",
)
def probe_verdicts_reply(ctx: Context) -> None:
    """With a probe armed, a chat and a text completion each carry `millm_probe_verdicts`
    (`mi.probe.result/v1` objects naming every armed probe) and the same results in a sorted
    X-miLLM-Probe-Verdicts header."""
    names = armed_of(ctx)
    _verdicts(ctx, "/chat/completions", ctx.chat_body(max_tokens=3), names)
    _verdicts(ctx, "/completions", ctx.completion_body(max_tokens=3), names)


@check("OAI-PROBE-08", "OAI-STREAM-09")
def probe_verdicts_stream_chunk(ctx: Context) -> None:
    """Streamed, the results come on one `choices: []` chunk after the choices' chunks and
    before any `millm` chunk and the `millm_steering` chunk; no header before the body."""
    armed_of(ctx)
    response, stream = streamed(ctx, "/chat/completions", ctx.chat_body(max_tokens=3, stream=True))
    if HEADER in response.headers:
        raise HeaderViolation(f"no {HEADER} on a stream", response.headers[HEADER], "OAI-PROBE-08")
    carrying = [i for i, chunk in enumerate(stream.chunks) if MEMBER in chunk]
    last_choice = max((i for i, c in enumerate(stream.chunks) if c["choices"]), default=-1)
    later = [i for i, c in enumerate(stream.chunks) if "millm" in c or "millm_steering" in c]
    if (
        len(carrying) != 1
        or stream.chunks[carrying[0]]["choices"] != []
        or carrying[0] < last_choice
        or (later and carrying[0] > later[0])
    ):
        raise StreamFramingViolation(
            f"one `choices: []` chunk with `{MEMBER}`, after the choices, before `millm` and "
            "`millm_steering`",
            f"{MEMBER} on chunks {carrying} of {len(stream.chunks)}",
            "OAI-PROBE-08",
        )
    for result in stream.chunks[carrying[0]][MEMBER]:
        _result(result)


@check("OAI-PROBE-15", "OAI-PROBE-16")
def probe_trace_context(ctx: Context) -> None:
    """A valid `traceparent` puts every result in its trace; a malformed one is ignored:
    the request is served and its results carry a fresh 32-hex trace id."""
    armed_of(ctx)
    for header, joins in ((TRACEPARENT, True), (TRACEPARENT[:-3], False)):
        response = ctx.post(
            "/chat/completions", ctx.chat_body(max_tokens=2), {"traceparent": header}
        )
        expect_status(response, 200, "OAI-PROBE-16")
        traces = {r.get("trace_id") for r in json_object(response).get(MEMBER) or []}
        ok = len(traces) == 1 and (traces == {TRACE_ID}) is joins
        ok = ok and all(TRACE.fullmatch(str(t)) for t in traces)
        want = TRACE_ID if joins else f"a fresh trace id, not {TRACE_ID}"
        _expect(ok, want, sorted(map(str, traces)), "OAI-PROBE-15" if joins else "OAI-PROBE-16")
