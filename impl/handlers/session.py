"""Handlers of the `session` tag (/api): info, load, unload, cancel, events, models."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from connexion.context import request
from starlette.responses import JSONResponse, StreamingResponse

from ..errors import ApiError
from ..generated import api
from ..http.sse import named
from ..models.catalog import view
from ..models.listing import list_local
from ..models.locator import is_loopback_peer
from .common import parse_local, request_body, state

PING_SECONDS = 15.0  # a `: ping` comment this often on a quiet stream (LOC-EVENTS-03)


async def info() -> JSONResponse:
    """GET /api/info."""
    return JSONResponse(state().session.info())


async def load() -> JSONResponse:
    """POST /api/session/load: 202 once the load is under way (LOC-LOAD-03;
    LOC-CONFIG-17: a stored config that does not validate is refused, nothing loads;
    409 busy while another load runs: docs/DECISIONS.md, statuses)."""
    req = parse_local(api.LoadRequest, request_body() or {})
    server = state()
    server.session.refuse_if_loading()  # before `model` is set: a refused load changes nothing
    server.planner.refuse_if_measuring()  # loads and measurements never overlap (LOC-SEC-68)
    local = is_loopback_peer(request.scope)
    engine = str(server.config.values["engine"])
    if req.model is None:  # the configured model, if the stored config validates
        config = server.config.view()
        if not config["valid"]:
            raise ApiError(
                "invalid_parameter", f"The stored config is invalid: {config['error']}", "config"
            )
        entry = server.session.target(
            str(config["values"]["model"]), peer_local=local, engine=engine
        )
    else:  # the model parameter is set first, then loaded (docs/DECISIONS.md, config layers)
        entry = server.session.target(req.model, peer_local=local, engine=engine)
        server.config.update(values={"model": req.model}, peer_local=local)
    if server.config.auto_plan:  # measured and applied before the 202 (LOC-LOAD-09/10)
        await server.planner.plan_for_load(entry)
    server.session.load(entry)
    return JSONResponse({"model": entry.model_id}, status_code=202)


async def unload() -> JSONResponse:
    """POST /api/session/unload: `{"ok": true}` and whether a model was loaded
    (docs/DECISIONS.md, statuses)."""
    server = state()
    server.planner.refuse_if_measuring()
    return JSONResponse({"ok": True, "unloaded": await server.session.unload()})


async def cancel() -> JSONResponse:
    """POST /api/cancel: always 200."""
    return JSONResponse({"cancelled": state().scheduler.cancel_holder()})


async def events() -> StreamingResponse:
    """GET /api/events: `state` on connect, then every event, and `: ping` when quiet."""
    server = state()

    async def stream() -> AsyncIterator[bytes]:
        async with server.bus.subscribe() as queue:
            yield named("state", server.session.info())
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), PING_SECONDS)
                except TimeoutError:
                    yield b": ping\n\n"
                    continue
                yield named(event.name, event.data)

    headers = {"Cache-Control": "no-cache"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


def _catalog() -> list[dict[str, object]]:
    """Every catalog entry with its state on disk (LOC-MODELS-28..37)."""
    downloads = state().downloads
    return [
        view(e, downloads.models_dir, downloads.endpoint, downloads.running(e.id))
        for e in downloads.catalog.all()
    ]


async def models() -> JSONResponse:
    """GET /api/models: the models directory, then each scan directory (LOC-MODELS)."""
    settings = state().settings
    models_dir = settings.resolved_models_dir
    scan_dirs = list(settings.scan_dirs)
    found = await asyncio.to_thread(list_local, models_dir, scan_dirs)
    return JSONResponse(
        {
            "models_dir": str(models_dir),
            "scan_dirs": [str(d) for d in scan_dirs],
            "local": [m.as_json() for m in found],
            "catalog": await asyncio.to_thread(_catalog),
        }
    )
