"""A server's `/metrics` read back with prometheus-client's own parser (issue 47)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str, name: str) -> list[Sample]:
    """Every sample named `name` in the exposition `text`."""
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]
