"""`miserver cluster`: a local Ray head with the cluster deployed on it, until stopped.

It starts Ray on this machine (or joins the one at `--address`), starts Serve's
HTTP proxy at `--host`/`--port`, deploys `miserver.cluster:app` with the given
`serve` flags, and tears everything down on SIGINT or SIGTERM. A KubeRay
RayService or `serve run` deploys the same application from a config file
instead (docs/CLUSTER.md).
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
    address: str | None = None  # a running Ray cluster's; None: start a local head


def run(layout: Layout, serve_args: Sequence[str]) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # the local head's processes, Serve's proxy among them, inherit this environment
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", CALLBACK)
    ray.init(address=layout.address, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": layout.host, "port": layout.port})
        application = app(
            {
                "serve_args": [*serve_args, "--host", layout.host, "--port", str(layout.port)],
                "engine_replicas": layout.engine_replicas,
                "ingress_replicas": layout.ingress_replicas,
                "engine_cpus": layout.engine_cpus,
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
