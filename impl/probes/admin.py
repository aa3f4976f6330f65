"""The probe management API (spec/openapi/api.yaml, tag `probes`): define, import, arm,
disarm, delete, list, and read the recorded results.

Every change goes to the database first; the armed set the request path reads
(`armed()`) is a copy refreshed on each change, so a completion costs no query.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ApiError, InvalidParameter
from ..metrics import Metrics
from ..store.probes import ProbeNotFound, ProbeRow, ProbeStore
from . import sidecar
from .definition import Probe, ProbeError, check_name, probe


def _not_found(name: str) -> ApiError:
    return ApiError("probe_not_found", f"No probe named `{name}`.", "name")


def _probe(row: ProbeRow) -> Probe:
    """The probe a stored row holds (a linear weight as read back, in float32)."""
    linear = row.definition["detector"]["kind"] == "linear"
    made = probe(row.definition, row.name, weight=row.weight if linear else None)
    return replace(made, armed=row.armed, created=row.created, updated=row.updated)


def _definition(p: Probe) -> dict[str, Any]:
    return {
        "detector": p.detector.view(),  # a linear weight goes in its own column
        "threshold": p.threshold,
        "windows": list(p.windows),
        "aggregate": p.aggregate,
        "description": p.description,
        "model": p.model,
    }


class ProbeAdmin:
    def __init__(self, store: ProbeStore, metrics: Metrics | None = None) -> None:
        self._store = store
        self._metrics = metrics  # each result recorded counts (GET /metrics)
        self._lock = threading.Lock()
        self._armed: tuple[Probe, ...] = tuple(map(_probe, store.armed()))

    def _changed(self) -> None:
        with self._lock:
            self._armed = tuple(map(_probe, self._store.armed()))

    def reload(self) -> None:
        """The armed probes read again, where another process of a cluster changed them."""
        self._changed()

    def armed(self) -> tuple[Probe, ...]:
        """The armed probes now, by name."""
        return self._armed

    def listing(self) -> dict[str, Any]:
        return {"object": "list", "data": [_probe(row).view() for row in self._store.every()]}

    def get(self, name: str) -> dict[str, Any]:
        try:
            return _probe(self._store.get(name)).view()
        except ProbeNotFound:
            raise _not_found(name) from None

    def put(self, name: str, raw: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Define or replace `name` from a `ProbeInput` body."""
        try:
            check_name(name)
            made = probe(raw, name)
        except ProbeError as exc:
            raise InvalidParameter(exc.param, f"The probe is invalid: {exc}.") from exc
        return self._save(made)

    def import_file(self, path: str, armed: bool | None) -> tuple[dict[str, Any], bool]:
        """Define or replace a probe from its `mi.probe/v1` sidecar."""
        try:
            made = sidecar.load(Path(path))
        except ProbeError as exc:
            param = exc.param if exc.param == "path" else f"sidecar.{exc.param}"
            raise InvalidParameter(param, f"The sidecar cannot be imported: {exc}.") from exc
        if armed is not None:
            made = replace(made, armed=armed)
        return self._save(made)

    def _save(self, made: Probe) -> tuple[dict[str, Any], bool]:
        stored, created = self._store.save(
            made.name, _definition(made), made.detector.weight, armed=made.armed
        )
        self._changed()
        return _probe(stored).view(), created

    def delete(self, name: str) -> dict[str, Any]:
        try:
            gone = _probe(self._store.get(name))
            self._store.delete(name)
        except ProbeNotFound:
            raise _not_found(name) from None
        self._changed()
        return gone.view()

    def arm(self, name: str, armed: bool) -> dict[str, Any]:
        try:
            changed = self._store.arm(name, armed)
        except ProbeNotFound:
            raise _not_found(name) from None
        self._changed()
        return _probe(changed).view()

    def named(self, names: Sequence[str]) -> list[Probe]:
        """The probes `names` lists, in order (a name unknown is 404 naming its place)."""
        found = []
        for i, name in enumerate(names):
            try:
                found.append(_probe(self._store.get(name)))
            except ProbeNotFound:
                raise ApiError(
                    "probe_not_found", f"No probe named `{name}`.", f"probes[{i}]"
                ) from None
        return found

    # -- results -------------------------------------------------------------------

    def record(self, results: Sequence[dict[str, Any]]) -> None:
        self._store.record(results)
        if self._metrics is not None:
            self._metrics.verdicts(
                (str(r["probe"]), str(r["outcome"]), str(r["verdict"])) for r in results
            )

    def events(
        self, after: int, limit: int, probe_name: str | None, request_id: str | None
    ) -> dict[str, Any]:
        page, last = self._store.results(
            after=after, limit=limit, probe_name=probe_name, request_id=request_id
        )
        data = [{"seq": seq, "result": result} for seq, result in page]
        return {"object": "list", "data": data, "next": last}
