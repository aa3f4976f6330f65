"""`miserver cluster`: a local Ray head with the cluster deployed on it, until stopped.

It starts Ray on this machine (or joins the one at `--address`), deploys
`miserver.cluster:app` with the given `serve` flags, and tears everything down
on SIGINT or SIGTERM. A KubeRay RayService or `serve run` deploys the same
application from a config file instead (docs/CLUSTER.md).

With one ingress replica (the default), that replica serves `--host`/`--port`
itself (Ray Serve's direct ingress), in Serve's throughput-optimized mode: a
request crosses one handle, ingress to engine replica, instead of two (Serve's
HTTP proxy to the ingress, then the ingress to the replica), which is most of
what the cluster adds to a request's time to its first token (BENCHMARKS.md).
With several, Serve's HTTP proxy listens at `--host`/`--port` and spreads
requests over them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import ray
from ray import serve

from .application import app
from .proxy import CALLBACK

log = logging.getLogger("miserver")


@dataclass(frozen=True, slots=True)
class Layout:
    host: str
    port: int
    engine_replicas: int = 2
    ingress_replicas: int = 1
    engine_cpus: float = 1.0
    engine_gpus: float = 0.0
    address: str | None = None  # a running Ray cluster's; None: start a local head


def direct(layout: Layout) -> dict[str, str]:
    """Ray Serve's settings (its environment) for the ingress replica to serve the port."""
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_DEFAULT_HTTP_HOST": layout.host,
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(layout.port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(layout.port + 1),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",  # a restarted ingress takes its port back
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",  # a stop waits 2 s, not 30
    }


def run(layout: Layout, serve_args: Sequence[str]) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # the local head's processes, Serve's among them, inherit this environment
    serving = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": CALLBACK}
    if layout.ingress_replicas == 1:
        serving |= direct(layout)
    os.environ.update(serving)
    # a head started here inherits the environment; the job's actors on a cluster joined by
    # --address get it through the job's runtime environment
    runtime_env = {"env_vars": serving} if layout.address else None
    ray.init(
        address=layout.address,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=runtime_env,
    )
    try:
        if layout.ingress_replicas == 1:  # Serve's own proxy on a loopback port of its choice
            serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1", "port": 0})
        else:
            serve.start(http_options={"host": layout.host, "port": layout.port})
        application = app(
            {
                "serve_args": [*serve_args, "--host", layout.host, "--port", str(layout.port)],
                "engine_replicas": layout.engine_replicas,
                "ingress_replicas": layout.ingress_replicas,
                "engine_cpus": layout.engine_cpus,
                "engine_gpus": layout.engine_gpus,
            }
        )
        serve.run(application, name="miserver", route_prefix="/", blocking=False)
        log.info(
            "cluster serving on http://%s:%d/v1 (%d engine replicas)",
            layout.host,
            layout.port,
            layout.engine_replicas,
        )
        stop.wait()
        return 0
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
