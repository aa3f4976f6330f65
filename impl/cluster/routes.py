"""Which deployment of a cluster answers each operation, by its operationId (spec/openapi).

ENGINE    any engine replica, placed by the router (router.py): everything
          that reads a model or the shared data dir
OPERATOR  a change of the operator's state (steering, profiles, circuits,
          probes, the model lock, the config, the session's model): run once,
          on one engine replica, under the control's lock; the control then
          moves the cluster's epoch (control.py)
BATCHES   the control's own server: files and batches, whose lines it runs
          through the router as requests of their own
EVENTS    the ingress's own relay of every replica's events (relay.py)
EVERY     sent to every live replica by the control, the answers merged
          (`/api/cancel`: whichever replica runs the generation stops it;
          `/v1/metrics`: every replica's, labelled `replica`: exposition.py)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable

from . import exposition


class Target(enum.Enum):
    ENGINE = "engine"
    OPERATOR = "operator"
    BATCHES = "batches"
    EVENTS = "events"
    EVERY = "every"


OPERATOR = frozenset(
    {
        "load",
        "unload",
        "attach_sae",
        "detach_sae",
        "set_live_values",
        "clear_live_values",
        "put_lock",
        "delete_lock",
        "set_active_profile",
        "put_profile",
        "delete_profile",
        "set_dial",
        "import_probe",
        "put_probe",
        "delete_probe",
        "arm_probe",
        "disarm_probe",
        "import_cluster",
        "import_circuit",
        "delete_circuit",
        "set_circuit_dial",
        "activate_circuit",
        "deactivate_circuit",
        "put_config",
        "apply_plan",
        "hf_add",
        "hf_forget",
    }
)
BATCHES = frozenset(
    {
        "upload_file",
        "list_files",
        "retrieve_file",
        "delete_file",
        "file_content",
        "create_batch",
        "list_batches",
        "retrieve_batch",
        "cancel_batch",
    }
)
# the session's model: a replica that catches up loads what the last of these asked
SESSION = frozenset({"load", "unload"})
Merge = Callable[[list[tuple[str, bytes]]], tuple[bytes, str]]


def _cancelled(answers: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    found = (json.loads(body) for _, body in answers)
    merged = {"cancelled": any(bool(f.get("cancelled")) for f in found)}
    return json.dumps(merged).encode(), "application/json"


# operations every replica answers, and how their answers (`(replica, body)` of each 200)
# merge into one body of a media type
EVERY: dict[str, Merge] = {
    "cancel": _cancelled,
    "metrics": exposition.merged,
}


def target(operation_id: str) -> Target:
    """The deployment that answers `operation_id` (Connexion's resolved id or the spec's)."""
    name = operation_id.rpartition(".")[2]
    if name in OPERATOR:
        return Target.OPERATOR
    if name in BATCHES:
        return Target.BATCHES
    if name == "events":
        return Target.EVENTS
    if name in EVERY:
        return Target.EVERY
    return Target.ENGINE
