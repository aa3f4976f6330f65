"""Probes without a model: the verdict header over its golden vectors, definitions and their
refusals, digests, windows and scores on known values, trace ids, and the SQLite store."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

from miserver import contract
from miserver.engines.monitor import Monitor
from miserver.probes import sidecar
from miserver.probes.admin import ProbeAdmin
from miserver.probes.definition import Probe, ProbeError, probe
from miserver.probes.trace import trace_id
from miserver.probes.verdicts import parse, serialize
from miserver.probes.watch import Served, Shape, Watch, Windows
from miserver.store.database import Database
from miserver.store.probes import ProbeNotFound, ProbeStore

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("miserver.spec") / "vectors" / "probe-verdicts-header.json").read_text("utf-8")
)
SERVED = Served(backend="serial", engine="transformers", model="m")
LINEAR = {
    "detector": {"kind": "linear", "layer": 1, "weight": [1.0, -1.0], "bias": 0.5},
    "threshold": 0.0,
    "windows": ["prompt", "completion", "last_user"],
}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_verdict_header_vectors(vector: dict[str, Any]) -> None:
    """OAI-PROBE-02, OAI-PROBE-03, OAI-PROBE-04 (open point 5): the header of each vector's
    results is its bytes exactly, in any input order, and parses back to them."""
    results = vector["results"]
    assert serialize(results, choices=vector["choices"]) == vector["header"]
    assert serialize(list(reversed(results)), choices=vector["choices"]) == vector["header"]
    parsed = parse(vector["header"])
    expected = sorted(results, key=lambda r: (r["probe"], r["window"], r["index"]))
    assert [(e["name"], e["window"], e["verdict"], e["reason"]) for e in parsed] == [
        (r["probe"], r["window"], r["verdict"], r["reason"]) for r in expected
    ]
    assert [e["score"] for e in parsed] == [r["score"] for r in expected]


def test_definition_refusals_name_the_field() -> None:
    """Issue 18 item 2: a probe that cannot be defined is refused naming the field at fault."""
    cases = [
        ({**LINEAR, "windows": []}, "windows"),
        ({**LINEAR, "windows": ["prompt", "prompt"]}, "windows[1]"),
        ({**LINEAR, "windows": ["everything"]}, "windows[0]"),
        ({**LINEAR, "threshold": True}, "threshold"),
        ({**LINEAR, "aggregate": "median"}, "aggregate"),
        ({**LINEAR, "detector": {"kind": "linear", "layer": 1}}, "detector.weight"),
        ({**LINEAR, "detector": {"kind": "linear", "layer": -1, "weight": [1]}}, "detector.layer"),
        (
            {**LINEAR, "detector": {"kind": "linear", "layer": 1, "weight": [1], "sae_id": "s"}},
            "detector.sae_id",
        ),
        (
            {**LINEAR, "detector": {"kind": "linear", "layer": 1, "file": "w.safetensors"}},
            "detector.file",
        ),
        ({**LINEAR, "detector": {"kind": "sae_features", "layer": 1}}, "detector.sae_id"),
        (
            {
                **LINEAR,
                "detector": {
                    "kind": "sae_features",
                    "layer": 1,
                    "sae_id": "s",
                    "features": [{"index": 3, "weight": 1}, {"index": 3, "weight": 2}],
                },
            },
            "detector.features[1].index",
        ),
        ({**LINEAR, "detector": {"kind": "mlp", "layer": 1}}, "detector.kind"),
    ]
    for raw, param in cases:
        with pytest.raises(ProbeError) as caught:
            probe(raw, "p")
        assert caught.value.param == param, (raw, caught.value)
    for name in ("", "Upper", "events", "score", "import", "-x", "a" * 65):
        with pytest.raises(ProbeError) as caught:
            probe(LINEAR, name)
        assert caught.value.param == "name"


def test_digests_pin_the_detector_and_the_decision() -> None:
    """OAI-PROBE-11: the detector digest changes with any weight and nothing else; the
    decision digest changes with the window, the aggregate and the threshold too."""
    base = probe(LINEAR, "p")
    assert base.detector_digest.startswith("sha256:") and len(base.detector_digest) == 71
    same = probe({**LINEAR, "threshold": 3.0, "aggregate": "max"}, "q")
    assert same.detector_digest == base.detector_digest
    assert same.decision_digest("prompt") != base.decision_digest("prompt")
    assert base.decision_digest("prompt") != base.decision_digest("completion")
    moved = probe({**LINEAR, "detector": {**LINEAR["detector"], "weight": [1.0, -1.5]}}, "p")
    assert moved.detector_digest != base.detector_digest


def _watch(raw: dict[str, Any], values: list[float]) -> tuple[Watch, Monitor]:
    made = probe(raw, "p")
    watch = Watch([made], "ab" * 16)
    watch.fit(Shape(model="m", engine="transformers", d_model=2, n_layers=4, monitoring=True))
    monitor = watch.monitor()
    assert monitor is not None
    if values:
        rows = torch.tensor([[v, 0.0] for v in values])  # weight [1, -1] + 0.5: v + 0.5
        monitor.feed(1, rows)
    return watch, monitor


def test_windows_aggregate_and_verdicts_on_known_values() -> None:
    """OAI-PROBE-10, OAI-PROBE-13, OAI-PROBE-14: each window reads its positions (prompt
    0..3, completion 3..5, last_user 1..3), aggregates them, and the verdict follows the
    threshold; results carry the legacy keys and the trace id."""
    watch, monitor = _watch(LINEAR, [0.0, 1.0, 2.0, -4.0, -6.0])
    windows = Windows(prompt=3, fed=2, user=(1, 3))
    results = {
        r["window"]: r
        for r in watch.results(monitor, windows, index=0, served=SERVED, request_id="chatcmpl-x")
    }
    assert results["prompt"]["score"] == pytest.approx(1.5)  # mean(0.5, 1.5, 2.5)
    assert results["last_user"]["score"] == pytest.approx(2.0)
    assert results["completion"]["score"] == pytest.approx(-4.5)
    assert (results["prompt"]["verdict"], results["prompt"]["reason"]) == (
        "flagged",
        "above_threshold",
    )
    assert (results["completion"]["verdict"], results["completion"]["reason"]) == (
        "clear",
        "below_threshold",
    )
    for window, result in results.items():
        assert result["name"] == result["probe"] == "p" and result["scored"] is True
        assert result["trace_id"] == "ab" * 16 and result["outcome"] == "scored"
        assert result["decision_digest"] == probe(LINEAR, "p").decision_digest(window)
    watch, monitor = _watch(
        {**LINEAR, "aggregate": "max", "detector": {**LINEAR["detector"], "link": "sigmoid"}},
        [0.0, 1.0, 2.0, -4.0, -6.0],
    )
    top = {
        r["window"]: r
        for r in watch.results(monitor, windows, index=0, served=SERVED, request_id="x")
    }
    assert top["prompt"]["score"] == pytest.approx(1 / (1 + math.exp(-2.5)))


def test_empty_and_interrupted_windows() -> None:
    """OAI-PROBE-09: a window with no position is skipped (`empty_window`, no score); a
    choice that ended early scores what ran, `interrupted` with the reason."""
    watch, monitor = _watch(LINEAR, [0.0, 1.0, 2.0, 3.0])
    done = watch.results(
        monitor, Windows(prompt=4, fed=0, user=None), index=0, served=SERVED, request_id="x"
    )
    for result in done:
        if result["window"] != "prompt":
            assert (result["outcome"], result["reason"], result["verdict"]) == (
                "skipped",
                "empty_window",
                "none",
            )
            assert result["score"] is None and result["scored"] is False
    cut = watch.results(
        monitor,
        Windows(prompt=3, fed=10**9, user=(0, 2)),
        index=0,
        served=SERVED,
        request_id="x",
        interrupted="client_disconnected",
    )
    by_window = {r["window"]: r for r in cut}
    assert {r["outcome"] for r in cut} == {"interrupted"}
    assert by_window["completion"]["tokens"] == 1  # only position 3 ran
    assert by_window["completion"]["score"] == pytest.approx(3.5)


def test_skip_reasons() -> None:
    """OAI-PROBE-12: a probe that cannot read this model says why (engine, width, layer,
    named model, SAE), with `served` stating how the request ran."""
    shape = Shape(model="m", engine="llama.cpp", d_model=2, n_layers=4, monitoring=False)
    cases = [
        (LINEAR, shape, "engine_unsupported"),
        (
            LINEAR,
            Shape(model="m", engine="t", d_model=3, n_layers=4, monitoring=True),
            "model_mismatch",
        ),
        (
            {**LINEAR, "model": "other"},
            Shape(model="m", engine="t", d_model=2, n_layers=4, monitoring=True),
            "model_mismatch",
        ),
        (
            {**LINEAR, "detector": {**LINEAR["detector"], "layer": 9}},
            Shape(model="m", engine="t", d_model=2, n_layers=4, monitoring=True),
            "layer_out_of_range",
        ),
        (
            {
                **LINEAR,
                "detector": {
                    "kind": "sae_features",
                    "layer": 1,
                    "sae_id": "s",
                    "features": [{"index": 0, "weight": 1}],
                },
            },
            Shape(model="m", engine="t", d_model=2, n_layers=4, monitoring=True),
            "sae_not_attached",
        ),
    ]
    for raw, where, reason in cases:
        watch = Watch([probe(raw, "p")], "cd" * 16)
        watch.fit(where)
        assert watch.monitor() is None
        results = watch.results(
            None, Windows(prompt=2, fed=1, user=(0, 1)), index=0, served=SERVED, request_id="x"
        )
        assert {(r["outcome"], r["reason"], r["verdict"]) for r in results} == {
            ("skipped", reason, "none")
        }
        assert results[0]["served"] == SERVED.view()


def test_results_validate_against_the_published_schema() -> None:
    """OAI-PROBE-10..14 (open point 4): every result shape validates against
    spec/schemas/mi-probe-result-v1.json."""
    schema = json.loads(contract.schema_bytes("mi-probe-result-v1.json"))
    watch, monitor = _watch(LINEAR, [0.0, 1.0, 2.0, 3.0])
    shaped = [
        *watch.results(
            monitor, Windows(prompt=2, fed=1, user=(0, 1)), index=0, served=SERVED, request_id="x"
        ),
        *watch.results(
            monitor,
            Windows(prompt=4, fed=0, user=None),
            index=1,
            served=SERVED,
            request_id="x",
            interrupted="generation_failed",
        ),
    ]
    for result in shaped:
        jsonschema.validate(result, schema)


@pytest.mark.parametrize(
    ("values", "valid"),
    [
        (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"], True),
        (["00-00000000000000000000000000000000-00f067aa0ba902b7-01"], False),
        (["not a traceparent"], False),
        (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"] * 2, False),
        ([], False),
    ],
    ids=["valid", "zero-trace", "malformed", "repeated", "absent"],
)
def test_trace_ids(values: list[str], valid: bool) -> None:
    """OAI-PROBE-15, OAI-PROBE-16 (open point 24): a valid traceparent sent once gives its
    trace id; a malformed, repeated or absent one gives a fresh random id."""
    found = trace_id(values)
    assert len(found) == 32 and int(found, 16) != 0
    if valid:
        assert found == "4bf92f3577b34da6a3ce929d0e0e4736"
    else:
        assert found != "4bf92f3577b34da6a3ce929d0e0e4736" and found != trace_id(values)


def test_store_persists_probes_and_pages_results(database_at: Path | str) -> None:
    """Issue 18 item 2: probes (weights included) and their arming survive reopening the
    database (SQLite and PostgreSQL); results page by seq, filter by probe and request, and
    the oldest past the cap go."""
    path = database_at
    store = ProbeStore(Database(path), keep=3)
    admin = ProbeAdmin(store)
    saved, created = admin.put("p", {**LINEAR, "armed": True})
    assert created and saved["armed"]
    assert admin.put("p", LINEAR)[1] is False
    store.arm("p", True)
    reopened = ProbeAdmin(ProbeStore(Database(path)))
    [again] = reopened.armed()
    assert again.name == "p" and again.detector.weight == (1.0, -1.0)
    assert again.detector_digest == saved["detector_digest"] == reopened.get("p")["detector_digest"]
    with pytest.raises(ProbeNotFound):
        store.arm("q", True)
    rows = [{"probe": "p" if i % 2 else "q", "request_id": f"r{i}", "i": i} for i in range(5)]
    store.record(rows)
    page, last = store.results(after=0, limit=10)
    assert [r["i"] for _, r in page] == [2, 3, 4] and last == page[-1][0]
    assert [r["i"] for _, r in store.results(after=0, limit=10, probe_name="p")[0]] == [3]
    assert [r["i"] for _, r in store.results(after=0, limit=10, request_id="r4")[0]] == [4]
    assert store.results(after=last, limit=10) == ([], last)


def test_sidecar_import_reads_the_weights_beside_it(tmp_path: Path) -> None:
    """Issue 18 item 2: a sidecar's `file` is read from its own folder (weight and bias);
    a name that leaves the folder, or a sidecar the schema refuses, is refused naming the
    field."""
    save_file(
        {"weight": torch.tensor([0.25, -0.5]), "bias": torch.tensor([1.5])},
        str(tmp_path / "w.safetensors"),
    )
    body = {
        "schema": "mi.probe/v1",
        "name": "side",
        "detector": {"kind": "linear", "layer": 2, "file": "w.safetensors"},
        "threshold": 0.5,
        "windows": ["prompt"],
    }
    (tmp_path / "side.json").write_text(json.dumps(body))
    loaded: Probe = sidecar.load(tmp_path / "side.json")
    assert loaded.detector.weight == (0.25, -0.5) and loaded.detector.bias == 1.5
    for detector, param in (
        ({"kind": "linear", "layer": 2, "file": "../w.safetensors"}, "detector.file"),
        ({"kind": "linear", "layer": "two", "file": "w.safetensors"}, "detector.layer"),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({**body, "detector": detector}))
        with pytest.raises(ProbeError) as caught:
            sidecar.load(tmp_path / "bad.json")
        assert caught.value.param == param
    with pytest.raises(ProbeError) as caught:
        sidecar.load(Path("relative.json"))
    assert caught.value.param == "path"


def test_values_past_float32_are_refused_and_an_overflow_is_no_score() -> None:
    """Issue 24's rule for the probe routes: a weight or bias float32 cannot hold is a 400
    naming it (never a 500 when stored), and a detector that overflows anyway gives no
    score (`skipped`, `non_finite_score`) rather than an Infinity JSON cannot carry."""
    huge = {**LINEAR, "detector": {**LINEAR["detector"], "weight": [1.0, 1e308]}}
    with pytest.raises(ProbeError) as caught:
        probe(huge, "p")
    assert caught.value.param == "detector.weight[1]"
    with pytest.raises(ProbeError) as caught:
        probe({**LINEAR, "detector": {**LINEAR["detector"], "bias": -1e39}}, "p")
    assert caught.value.param == "detector.bias"
    watch, monitor = _watch(LINEAR, [])
    monitor.feed(1, torch.tensor([[3e38, -3e38], [3e38, -3e38]]))  # 3e38 + 3e38: inf
    result = watch.results(
        monitor, Windows(prompt=2, fed=0, user=None), index=0, served=SERVED, request_id="x"
    )[0]
    assert (result["outcome"], result["reason"], result["score"]) == (
        "skipped",
        "non_finite_score",
        None,
    )
    json.dumps(result, allow_nan=False)
