"""Every engine replica's metrics as one exposition (issue 49: /v1/metrics through the
cluster, impl/cluster/exposition.py), read back with prometheus-client's parser."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from miserver.cluster.exposition import merged
from miserver.metrics import CONTENT_TYPE


def _replica(requests: int, running: int) -> bytes:
    registry = CollectorRegistry()
    served = Counter(
        "vllm:request_success", "Finished requests.", ["model_name"], registry=registry
    )
    served.labels("m").inc(requests)
    ttft = Histogram("vllm:ttft", "TTFT.", ["model_name"], registry=registry, buckets=(0.1, 1))
    ttft.labels("m").observe(0.05 * requests)
    Gauge("vllm:running", "Running.", ["model_name"], registry=registry).labels("m").set(running)
    return generate_latest(registry)


def test_each_sample_keeps_its_labels_and_names_its_replica() -> None:
    body, media_type = merged([("r1", _replica(3, 1)), ("r2", _replica(5, 0))])
    assert media_type == CONTENT_TYPE
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    counted = {
        s.labels["replica"]: s.value
        for s in families["vllm:request_success"].samples
        if s.name == "vllm:request_success_total"
    }
    assert counted == {"r1": 3.0, "r2": 5.0}
    assert families["vllm:request_success"].type == "counter"
    assert families["vllm:ttft"].type == "histogram"
    buckets = [s for s in families["vllm:ttft"].samples if s.name == "vllm:ttft_bucket"]
    assert {(s.labels["replica"], s.labels["le"]) for s in buckets} == {
        (r, le) for r in ("r1", "r2") for le in ("0.1", "1.0", "+Inf")
    }
    assert all(s.labels["model_name"] == "m" for f in families.values() for s in f.samples)
    # one family each: every TYPE line once, whatever the number of replicas
    types = [line for line in body.decode().splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))


def test_no_replica_is_an_empty_exposition() -> None:
    assert merged([]) == (b"", CONTENT_TYPE)
