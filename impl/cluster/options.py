"""A cluster deployment's settings: the flags of `miserver serve`, given as a list.

Every deployment of one cluster takes the same `serve_args` (the Serve config's
`args`), so its ingress, control and engine replicas agree on the data dir, the
model and the limits. Only the ingress meets clients: the others serve
requests in process, from loopback, so they run with the loopback policy and no
key whatever the flags say (the ingress checked the client's).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .. import settings as settings_mod
from ..local import params
from ..settings import Settings


def parsed(argv: Sequence[str], *, facing: bool) -> tuple[Settings, Mapping[str, Any]]:
    """The settings and the parameter rows' launch flags of `miserver serve ARGV`; `facing`:
    the deployment clients reach (the ingress)."""
    parser = argparse.ArgumentParser(prog="miserver cluster", add_help=False)
    taken = {flag for _, _, flag, _ in settings_mod.documented() if flag}
    settings_mod.add_flags(parser)
    params.add_flags(parser, taken)
    args = parser.parse_args(list(argv))
    settings = settings_mod.from_args(args)
    if not facing:
        settings = dataclasses.replace(
            settings, host="127.0.0.1", api_key=None, api_key_file=None, no_api_key=False
        )
    return settings, params.launch_values(args)


def engine_threads(settings: Settings, reserved_cpus: float) -> Settings:
    """An engine replica's settings, its `--threads` the CPUs Ray reserved for it
    (`engine_cpus`) when the flags left it 0: replicas Ray places on one machine then run
    no more threads than it has cores between them (a replica's default is every usable
    core: two on two cores ran at a third of one server under eight clients,
    BENCHMARKS.md). With none reserved (`engine_cpus` 0, replicas sharing the cores) the
    server's own default stays."""
    if settings.threads or reserved_cpus < 1:
        return settings
    return dataclasses.replace(settings, threads=int(reserved_cpus))
