"""`miserver serve ...`, `miserver plan ...` and `miserver steering-hash ...`: the command
line."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from . import settings as settings_mod
from .access import StartRefused, access_policy
from .local import params
from .request_context import RequestIdFilter
from .store.database import Database, DatabaseUnavailable

log = logging.getLogger("miserver")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="miserver",
        description="miserver: an OpenAI-compatible inference server with SAE steering.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    taken = {flag for _, _, flag, _ in settings_mod.documented() if flag}
    serve = commands.add_parser(
        "serve", help="serve the /v1 API (default model: SmolLM2-135M-Instruct)"
    )
    _serve_flags(serve, taken)
    planning = commands.add_parser(
        "plan",
        help="measure this machine and print the plan for the configured model (GET /api/plan)",
    )
    settings_mod.add_flags(planning)
    params.add_flags(planning, taken)
    planning.add_argument(
        "--json", action="store_true", help="print the whole proposal as JSON instead"
    )
    schemas = commands.add_parser("schemas", help="the published contract (spec/)")
    schema_commands = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schema_commands.add_parser(
        "export",
        help="write the OpenAPI documents (YAML and JSON) and the JSON Schemas under DIR",
    )
    export.add_argument("dir", help="the folder to write (created if missing)")
    cluster = commands.add_parser(
        "cluster",
        help="serve on a local Ray head: an ingress, engine replicas and the control "
        "(pip install 'miserver[cluster]'); every other flag is a `serve` flag",
    )
    _cluster_flags(cluster)
    hashing = commands.add_parser(
        "steering-hash",
        help="print the steering-set hash of an SAE ID and features (as in X-miLLM-Steering)",
    )
    _hash_flags(hashing)
    return parser


def _serve_flags(serve: argparse.ArgumentParser, taken: set[str]) -> None:
    settings_mod.add_flags(serve)
    params.add_flags(serve, taken)  # every other parameter row's flag (LOC-PARAMS-09)
    serve.add_argument(
        "--describe-params",
        action="store_true",
        help="print the parameter table (GET /api/params, with the table's own defaults) "
        "as JSON and exit",
    )
    serve.add_argument(
        "--probe-device",
        action="store_true",
        help="print the compute devices beyond the host as JSON and exit (the planner runs "
        "this in a child process, so a driver that ends its process cannot end the server)",
    )
    serve.add_argument(
        "--probe-kernels",
        metavar="ASK",
        help="time the engine's kernels as the JSON ASK says, print the timings as JSON and "
        "exit (the planner runs this in a child process: planner/kernels.py)",
    )


def _cluster_flags(cluster: argparse.ArgumentParser) -> None:
    cluster.add_argument("--host", default="127.0.0.1", help="address the ingress binds")
    cluster.add_argument("--port", type=int, default=8000, help="TCP port the ingress binds")
    cluster.add_argument("--engine-replicas", type=int, default=2, help="engine replicas")
    cluster.add_argument("--ingress-replicas", type=int, default=1, help="ingress replicas")
    cluster.add_argument(
        "--engine-cpus", type=float, default=1.0, help="Ray CPUs each engine replica takes"
    )
    cluster.add_argument(
        "--engine-gpus", type=float, default=0.0, help="Ray GPUs each engine replica takes"
    )
    cluster.add_argument(
        "--address", default=None, help="a running Ray cluster to join (default: start one)"
    )


def _hash_flags(hashing: argparse.ArgumentParser) -> None:
    hashing.add_argument("--sae-id", required=True, help="the SAE ID the features apply to")
    hashing.add_argument(
        "--features",
        required=True,
        help='JSON list of {"index": int, "strength": number} or [index, strength] pairs',
    )
    hashing.add_argument(
        "--canonical", action="store_true", help="print the canonical form instead of the hash"
    )


def serve(args: argparse.Namespace) -> int:
    """Check the start-up rules (exit 2 on a refusal, nothing listens), then serve."""
    if args.describe_params or args.probe_device or args.probe_kernels:
        return _describe(args)
    settings = settings_mod.from_args(args)
    _log_requests(settings.log_level)
    try:
        policy = access_policy(settings)
    except StartRefused as exc:
        log.error("refusing to start: %s", exc)
        return 2
    if policy.warning is not None:
        log.warning("%s", policy.warning)

    import uvicorn

    from .app import Server
    from .models.catalog import CatalogError

    try:
        server = Server(settings, policy=policy, flags=params.launch_values(args))
    except (CatalogError, DatabaseUnavailable) as exc:  # --catalog, --database-url
        log.error("refusing to start: %s", exc)
        return 2
    log.info(
        "serving %s on http://%s:%d/v1", server.launch_model_id(), settings.host, settings.port
    )
    # Everything imported and built so far lives as long as the process: out of the cyclic
    # collector's sight, a full collection no longer walks torch's and transformers' modules
    # between tokens, and the exit no longer takes seconds to tear them down one by one.
    gc.freeze()
    uvicorn.run(
        server,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        proxy_headers=False,  # the TCP peer decides who is local, never a header (LOC-SEC-65)
    )
    return 0


def _describe(args: argparse.Namespace) -> int:
    """`serve --describe-params`, `--probe-device` or `--probe-kernels`: JSON out, no server."""
    if args.describe_params:
        sys.stdout.write(json.dumps(params.described(), indent=2) + "\n")
        return 0
    if args.probe_device:
        from .planner import devices

        sys.stdout.write(json.dumps(devices.report()) + "\n")
        return 0
    from .planner import kernels

    timed = kernels.run(kernels.Ask.from_json(args.probe_kernels))
    sys.stdout.write(json.dumps([dataclasses.asdict(k) for k in timed]) + "\n")
    return 0


def _log_requests(level: str) -> None:
    """Logging at `level`, every line naming its request (or `-`)."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())


def plan(args: argparse.Namespace) -> int:
    """`miserver plan`: the plan's sentences and `explain`, for a person (or `--json`)."""
    import asyncio

    from .app import Server
    from .errors import ApiError

    settings = settings_mod.from_args(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    server = Server(settings, preload=False, flags=params.launch_values(args))
    try:
        proposal = asyncio.run(server.state.planner.measure())
    except ApiError as exc:
        sys.stderr.write(f"miserver plan: {exc.message}\n")
        return 1
    finally:
        server.shutdown()
    if args.json:
        sys.stdout.write(json.dumps(proposal, indent=2) + "\n")
        return 0
    if "error" in proposal:
        sys.stderr.write(f"miserver plan: {proposal['error']}\n")
        return 1
    lines = [proposal["summary"]["sentence"], f"This machine: {proposal['machine']}.", ""]
    lines += [
        f"- {d['label']}: {d['value_text']}. {d['brief']}"
        for d in proposal["decisions"]
        if d["group"] != "notes"
    ]
    lines += ["", "To serve with it: miserver serve " + " ".join(proposal["args"]), ""]
    sys.stdout.write("\n".join(lines) + "\n" + proposal["explain"])
    return 0


def steering_hash(args: argparse.Namespace) -> int:
    from .steering import canonical_form, steering_set_hash

    try:
        raw = json.loads(args.features)
    except ValueError as exc:
        sys.stderr.write(f"miserver steering-hash: --features is not valid JSON: {exc}\n")
        return 2
    try:
        if not isinstance(raw, list):
            raise TypeError(f"--features must be a JSON list, not {type(raw).__name__}")
        features = [tuple(f) if isinstance(f, list) else f for f in raw]
        text = (
            canonical_form(args.sae_id, features)
            if args.canonical
            else steering_set_hash(args.sae_id, features) + "\n"
        )
    except (ValueError, TypeError) as exc:
        sys.stderr.write(f"miserver steering-hash: invalid steering set: {exc}\n")
        return 2
    sys.stdout.write(text)
    return 0


def schemas(args: argparse.Namespace) -> int:
    """`miserver schemas export DIR`: the contract's files, one path per line."""
    from . import contract

    for path in contract.export(Path(args.dir)):
        sys.stdout.write(f"{path}\n")
    return 0


def _database_usable(settings: settings_mod.Settings) -> None:
    """A cluster's PostgreSQL opened (and migrated) once before Ray starts: every deployment
    opens it, and a DSN that cannot be used is refused here, not in each replica."""
    if settings.database_url is not None:
        Database(settings.database_url).close()


def cluster(args: argparse.Namespace, serve_args: Sequence[str]) -> int:
    """`miserver cluster`: the `serve` flags checked here first, then Ray started."""
    serve_parser = argparse.ArgumentParser(prog="miserver cluster")
    settings_mod.add_flags(serve_parser)
    params.add_flags(serve_parser, {flag for _, _, flag, _ in settings_mod.documented() if flag})
    given = serve_parser.parse_args([*serve_args, "--host", args.host, "--port", str(args.port)])
    settings = settings_mod.from_args(given)
    _log_requests(settings.log_level)
    try:
        access_policy(settings)
        _database_usable(settings)
    except (StartRefused, DatabaseUnavailable) as exc:
        log.error("refusing to start: %s", exc)
        return 2
    from .cluster.local import Layout, run

    layout = Layout(
        args.host, args.port, args.engine_replicas, args.ingress_replicas, args.engine_cpus,
        args.engine_gpus, args.address,
    )  # fmt: skip
    return run(layout, serve_args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "cluster":
        sys.exit(cluster(args, rest))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    commands = {"serve": serve, "plan": plan, "schemas": schemas, "steering-hash": steering_hash}
    sys.exit(commands[args.command](args))


if __name__ == "__main__":
    main()
