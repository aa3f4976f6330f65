"""Publish the contract's JSON Schemas (2020-12) from spec/openapi/*.yaml.

    python -m tools.schemas           # write every file of spec/schemas/
    python -m tools.schemas --check   # exit 1 when one is stale

Each file is lifted out of an OpenAPI document (`PUBLISHED`):

- millm-scoring-api-v1.json (v1.yaml): the scoring contract, below.
- mi-probe-result-v1.json (v1.yaml `ProbeResult`): a probe result, as the
  `millm_probe_verdicts` member and GET /api/probes/events carry it.
- mi-probe-v1.json (api.yaml `ProbeDefinition`): a probe as a file, the sidecar
  POST /api/probes/import reads.
- mi-circuit-v1.json, mi-cluster-v1.json (api.yaml `CircuitDocument`,
  `ClusterDocument`): the documents circuits and clusters are imported from.
- mi-catalog-v1.json (api.yaml `CatalogDocument`): the download catalog the
  package ships (miserver/models/catalog.json).

The server routes and validates with v1.yaml; this tool lifts the scoring
request (completion and chat), response and refusal schemas out of it,
turns OpenAPI 3.0's `nullable` into JSON Schema types, and writes them
under `$defs`. The server serves the file at
`GET /api/schemas/millm-scoring-api-v1.json`, and a test checks that what it
serves is this tool's output (OAI-F32-25).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec" / "openapi" / "v1.yaml"
API_SPEC = ROOT / "spec" / "openapi" / "api.yaml"
OUT = ROOT / "spec" / "schemas" / "millm-scoring-api-v1.json"
NAME = "millm-scoring-api-v1.json"
ROOTS = {
    "completion_request": "CompletionRequest",
    "chat_request": "ChatCompletionRequest",
    "completion_response": "Completion",
    "chat_response": "ChatCompletion",
    "refusal": "ErrorResponse",
}
REFUSAL_CODES = [
    "invalid_scoring_request",
    "field_not_honoured",
    "invalid_parameter",
    "context_length_exceeded",
    "model_not_found",
    "non_finite_logits",
    "scoring_precision_unavailable",
]
PRECISION_REASONS = ["model_not_float32_castable", "memory", "device", "busy"]

log = logging.getLogger("schemas")


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref.rsplit("/", 1)[-1]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _needed(schemas: dict[str, Any], roots: list[str] | None = None) -> list[str]:
    seen: list[str] = []
    todo = list(ROOTS.values()) if roots is None else list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.append(name)
            todo.extend(_refs(schemas[name]))
    return sorted(seen)


def _convert(node: Any) -> Any:
    """OpenAPI 3.0 schema -> JSON Schema 2020-12 (refs to $defs, nullable to null types)."""
    if isinstance(node, list):
        return [_convert(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _convert(v) for k, v in node.items() if k != "nullable"}
    if "$ref" in out:
        out["$ref"] = "#/$defs/" + out["$ref"].rsplit("/", 1)[-1]
    if node.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def build() -> str:
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    schemas = spec["components"]["schemas"]
    defs = {name: _convert(schemas[name]) for name in _needed(schemas)}
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": NAME,
        "title": "miLLM scoring API v1",
        "description": (
            "Scoring mode of /v1/completions and /v1/chat/completions: next-token "
            "log-probabilities instead of text (OAI-SCORE, OAI-CSCORE, OAI-F32). Generated "
            "from miserver's spec/openapi/v1.yaml by tools/schemas.py."
        ),
        "version": spec["info"]["version"],
        "type": "object",
        "properties": {key: {"$ref": f"#/$defs/{name}"} for key, name in ROOTS.items()},
        "$defs": {
            **defs,
            "RefusalCode": {"type": "string", "enum": REFUSAL_CODES},
            "ScoringPrecisionReason": {
                "type": "string",
                "enum": PRECISION_REASONS,
                "description": (
                    "X-miLLM-Scoring-Precision-Reason of a 409 scoring_precision_unavailable."
                ),
            },
        },
    }
    return json.dumps(document, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def _single(spec_path: Path, root: str, name: str, title: str, description: str) -> str:
    """A schema whose document is `root` of `spec_path`, its references under `$defs`."""
    spec = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    schemas = spec["components"]["schemas"]
    defs = {n: _convert(schemas[n]) for n in _needed(schemas, [root]) if n != root}
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": name,
        "title": title,
        "description": description,
        "version": spec["info"]["version"],
        **_convert(schemas[root]),
    }
    if defs:
        document["$defs"] = defs
    return json.dumps(document, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def build_probe_result() -> str:
    return _single(
        SPEC,
        "ProbeResult",
        "mi-probe-result-v1.json",
        "mi.probe.result/v1",
        "What one armed probe found in one window of one choice (REQ-000 PROBE, open point 4). "
        "Generated from miserver's spec/openapi/v1.yaml (ProbeResult) by tools/schemas.py.",
    )


def build_probe() -> str:
    return _single(
        API_SPEC,
        "ProbeDefinition",
        "mi-probe-v1.json",
        "mi.probe/v1",
        "A probe as a file: the JSON sidecar POST /api/probes/import reads. Generated from "
        "miserver's spec/openapi/api.yaml (ProbeDefinition) by tools/schemas.py.",
    )


def build_circuit() -> str:
    return _single(
        API_SPEC,
        "CircuitDocument",
        "mi-circuit-v1.json",
        "mi.circuit/v1",
        "A circuit: a multi-layer intervention across several SAEs, with its evidence rung "
        "(REQ-000 CIRCUIT, RUNG). Generated from miserver's spec/openapi/api.yaml "
        "(CircuitDocument) by tools/schemas.py.",
    )


def build_cluster() -> str:
    return _single(
        API_SPEC,
        "ClusterDocument",
        "mi-cluster-v1.json",
        "mi.cluster/v1",
        "A cluster: features of one SAE at one layer with authored strengths and a dial "
        "(REQ-000 DIAL). Generated from miserver's spec/openapi/api.yaml (ClusterDocument) "
        "by tools/schemas.py.",
    )


def build_catalog() -> str:
    return _single(
        API_SPEC,
        "CatalogDocument",
        "mi-catalog-v1.json",
        "mi.catalog/v1",
        "A download catalog: models as files of a Hugging Face repository at a pinned "
        "revision, with sizes and SHA-256 sums (REQ-003 MODELS, DL). Generated from "
        "miserver's spec/openapi/api.yaml (CatalogDocument) by tools/schemas.py.",
    )


SCHEMAS = ROOT / "spec" / "schemas"
PUBLISHED = {
    OUT: build,
    SCHEMAS / "mi-probe-result-v1.json": build_probe_result,
    SCHEMAS / "mi-probe-v1.json": build_probe,
    SCHEMAS / "mi-circuit-v1.json": build_circuit,
    SCHEMAS / "mi-cluster-v1.json": build_cluster,
    SCHEMAS / "mi-catalog-v1.json": build_catalog,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stale = 0
    for out, builder in PUBLISHED.items():
        text = builder()
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if args.check:
            if current != text:
                log.error("%s is stale: run python -m tools.schemas", out.relative_to(ROOT))
                stale += 1
            else:
                log.info("%s is current", out.relative_to(ROOT))
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        log.info("wrote %s", out.relative_to(ROOT))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
