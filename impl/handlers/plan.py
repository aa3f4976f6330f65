"""Handlers of the `plan` tag (/api/plan): the planner's proposal, and applying it."""

from __future__ import annotations

from starlette.responses import JSONResponse

from .common import state


async def get_plan(cached: int = 0, measure: int = 0) -> JSONResponse:
    """GET /api/plan (LOC-PLAN-01..55)."""
    planner = state().planner
    return JSONResponse(await planner.get(cached=bool(cached), measure=bool(measure)))


async def apply_plan() -> JSONResponse:
    """POST /api/plan/apply (LOC-APPLY-01..08)."""
    return JSONResponse(state().planner.apply())
