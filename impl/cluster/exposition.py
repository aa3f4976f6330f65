"""Every engine replica's metrics as one Prometheus exposition (`GET /v1/metrics` through
the cluster: routes.EVERY).

Each replica's text is read with prometheus-client's own parser; every sample keeps
its labels and gains `replica` (the replica's id, as `X-miLLM-Replica` names it), and
each metric family is written once, with the samples of every replica under it, by
prometheus-client's own writer. A dashboard sums over `replica` for the cluster, or
reads one replica, as vLLM's data-parallel engines are read by their `engine` label.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ..metrics import CONTENT_TYPE

LABEL = "replica"


class _Families:
    """A collector of the merged families, for prometheus-client's writer."""

    def __init__(self, answers: Sequence[tuple[str, bytes]]) -> None:
        self._families: dict[str, Metric] = {}
        for replica, body in answers:
            for family in text_string_to_metric_families(body.decode("utf-8")):
                kept = self._families.setdefault(
                    family.name,
                    Metric(family.name, family.documentation, family.type, family.unit),
                )
                kept.samples.extend(_labelled(s, replica) for s in family.samples)

    def collect(self) -> Iterator[Metric]:
        yield from self._families.values()


def _labelled(sample: Sample, replica: str) -> Sample:
    return sample._replace(labels={**sample.labels, LABEL: replica})


def merged(answers: Sequence[tuple[str, bytes]]) -> tuple[bytes, str]:
    """The replicas' expositions (`(replica, text)`) as one, and its media type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(answers))
    return generate_latest(registry), CONTENT_TYPE
