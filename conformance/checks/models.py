"""`GET /v1/models` and `GET /v1/models/{id}` (REQ-000 MODELS, EP-04/05)."""

from __future__ import annotations

from typing import Any

from ..context import Context
from ..failures import BodyShapeViolation
from ..registry import check
from ..responses import expect_error, expect_status, is_int, json_object, shown

LISTED_STATES = ("READY", "LOADED", "LOADING")
UNKNOWN_MODEL = "conformance-kit-no-such-model:Q0"
UNKNOWN_REPO_MODEL = "conformance-kit/no-such-model-GGUF:Q4_K_M"


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one `data` entry, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    if not isinstance(entry.get("id"), str) or not entry["id"]:
        return "`id` is not a non-empty string"
    if entry.get("object") != "model":
        return '`object` is not "model"'
    if not is_int(entry.get("created")) or entry["created"] < 0:
        return "`created` is not a non-negative integer (Unix seconds)"
    if not isinstance(entry.get("owned_by"), str):
        return "`owned_by` is not a string"
    if "state" in entry and entry["state"] not in LISTED_STATES:
        return f"`state` {entry['state']!r} is not one of {', '.join(LISTED_STATES)}"
    return None


@check("OAI-EP-04", "OAI-MODELS-01", "OAI-MODELS-02", "OAI-MODELS-03")
def models_list_shape(ctx: Context) -> None:
    """GET /models is `{"object": "list", "data": [{id, object: "model", created, owned_by}]}`."""
    response = ctx.get("/models")
    expect_status(response, 200, "OAI-EP-04")
    body = json_object(response, "OAI-MODELS-01")
    if body.get("object") != "list" or not isinstance(body.get("data"), list):
        raise BodyShapeViolation(
            '{"object": "list", "data": [...]}', shown(response), "OAI-MODELS-01"
        )
    for entry in body["data"]:
        problem = _entry_problem(entry)
        if problem:
            requirement = "OAI-MODELS-03" if "`state`" in problem else "OAI-MODELS-02"
            raise BodyShapeViolation(
                "each entry {id, object: model, created, owned_by}",
                f"{entry!r}: {problem}",
                requirement,
            )
    ids = [entry["id"] for entry in body["data"]]
    if len(ids) != len(set(ids)):
        raise BodyShapeViolation("each model listed once", f"ids {ids}", "OAI-MODELS-02")


@check("OAI-EP-05", "OAI-MODELS-07", "OAI-ERR-03")
def model_retrieve_matches_listing(ctx: Context) -> None:
    """GET /models/{id} returns the listed entry; an unknown id is 404 model_not_found."""
    listed = json_object(ctx.get("/models")).get("data")
    entries = {e.get("id"): e for e in listed or [] if isinstance(e, dict)}
    response = ctx.get(f"/models/{ctx.model}")
    expect_status(response, 200, "OAI-EP-05")
    body = json_object(response, "OAI-MODELS-07")
    problem = _entry_problem(body)
    if problem or body["id"] != ctx.model:
        raise BodyShapeViolation(
            f"the model object of {ctx.model!r}", f"{shown(response)} ({problem})", "OAI-MODELS-07"
        )
    if ctx.model in entries and entries[ctx.model].get("owned_by") != body.get("owned_by"):
        raise BodyShapeViolation(
            "the same object /models lists", f"{body!r} vs {entries[ctx.model]!r}", "OAI-MODELS-07"
        )
    expect_error(ctx.get(f"/models/{UNKNOWN_MODEL}"), 404, "model_not_found", "OAI-ERR-03")


@check("OAI-MODELS-07", "OAI-GGUF-02", "OAI-ERR-03")
def model_ids_may_contain_slashes(ctx: Context) -> None:
    """GET /models/{id} routes ids with `/` (`org/Model-GGUF:Q4_K_M`): unknown is model_not_found.

    A route that stops at the first `/` answers a generic 404 instead, so a
    listed `org/...` model could never be retrieved.
    """
    response = ctx.get(f"/models/{UNKNOWN_REPO_MODEL}")
    expect_error(response, 404, "model_not_found", "OAI-MODELS-07")
