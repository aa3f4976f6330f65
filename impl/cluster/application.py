"""The Serve application: the three deployments bound together (see the package's docstring)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application

from .control import Control
from .ingress import Ingress
from .replica import EngineReplica

__all__ = ["app"]

ROUTER = "miserver.cluster.router:SteeringRouter"  # Serve imports it where it routes


def app(args: Mapping[str, Any]) -> Application:
    """The Serve application (an application builder: Serve calls it with the config's
    `args`)."""
    argv = [str(a) for a in args.get("serve_args", [])]
    # what an ingress shows an engine replica's port (hop.py): the config's, or one of this
    # deployment's own
    key = str(args.get("cluster_key") or secrets.token_urlsafe(32))
    engine = serve.deployment(
        name="EngineReplica",
        num_replicas=int(args.get("engine_replicas", 2)),
        max_ongoing_requests=int(args.get("max_ongoing_requests", 64)),
        ray_actor_options={
            "num_cpus": float(args.get("engine_cpus", 1)),
            "num_gpus": float(args.get("engine_gpus", 0)),  # Ray sets CUDA_VISIBLE_DEVICES
        },
        request_router_config={"request_router_class": ROUTER},
        health_check_period_s=2,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=5,
    )(EngineReplica).bind(argv, key)
    control = serve.deployment(
        name="Control",
        num_replicas=1,
        max_ongoing_requests=1024,  # every replica's and ingress's long poll of the epoch
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=1,
    )(Control).bind(argv, key, engine)
    ingress = serve.deployment(
        name="Ingress",
        num_replicas=int(args.get("ingress_replicas", 1)),
        max_ongoing_requests=1024,
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=5,
    )(serve.ingress()(Ingress)).bind(argv, key, engine, control)
    return ingress
