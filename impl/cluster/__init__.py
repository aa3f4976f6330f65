"""miserver on Ray Serve: one endpoint, many engine replicas, the same contract.

    miserver.cluster:app    the Serve application (`serve run miserver.cluster:app`,
                            or a Serve config YAML: the file a KubeRay RayService takes)
    miserver cluster        starts a local Ray head and deploys it

Deployments (docs/CLUSTER.md):

    Ingress        the Connexion app: contract, security model, validation; no model;
                   sends each validated request on (forwarding.py)
    EngineReplica  one engine and its serving core each (replica.py), placed by the
                   steering-aware router (router.py), reached on its own port (hop.py)
    Control        the operator's state and the cluster's epoch; files and batches
                   (control.py)

Arguments (the config's `args`): `serve_args`, the flags of `miserver serve` every
deployment takes (the same data dir for all: it holds the shared database);
`engine_replicas` (2), `ingress_replicas` (1), `engine_cpus` (1, Ray's CPUs per
engine replica), `engine_gpus` (0, Ray's GPUs per engine replica: each sees its own as
`cuda:0`), `max_ongoing_requests` (64 per engine replica, the control's calls),
`cluster_key` (what an ingress shows a replica's port; random by default).

Nothing outside this package imports Ray: the embedded server never does. Within it,
`affinity`, `placement`, `routes` and `relay` do not either (tools/bench/cluster_sim.py
uses the placement), and `app` is imported from `application` when first asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from .application import app

        return app
    raise AttributeError(name)
