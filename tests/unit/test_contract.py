"""Artifacts stay in sync: spec, generated code, error catalog, settings docs, layering."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from miserver.errors import catalog
from miserver.settings import documented
from tools import codegen, layering

ROOT = Path(__file__).resolve().parents[2]


def operations(document: str) -> list[dict[str, str]]:
    spec = yaml.safe_load((ROOT / "spec" / "openapi" / document).read_text())
    return [
        op
        for item in spec["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    ]


@pytest.mark.parametrize("document", ["v1.yaml", "api.yaml"])
def test_every_operation_id_resolves_to_a_handler(document: str) -> None:
    """OAI-EP-01..05: each route of the contract has a handler: `operationId` is a short,
    unique name (what generated clients call) in the module `x-openapi-router-controller`
    names."""
    found = operations(document)
    names = [op["operationId"] for op in found]
    assert len(set(names)) == len(names)
    for op in found:
        module = importlib.import_module(op["x-openapi-router-controller"])
        assert "." not in op["operationId"]
        assert callable(getattr(module, op["operationId"])), op["operationId"]


def test_generated_models_are_current() -> None:
    """generated/ is exactly what tools/codegen makes from spec/ (never edited by hand)."""
    for path, text in codegen.expected().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: python -m tools.codegen"


def _codes_raised() -> set[str]:
    """Every literal error code passed to ApiError(...) in impl/."""
    codes = set()
    for path in (ROOT / "impl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "ApiError"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                codes.add(str(node.args[0].value))
    return codes


def test_every_raised_code_is_in_the_catalog() -> None:
    """OAI-ERR-01: one catalog (spec/policy/errors.yaml) decides status and type."""
    assert _codes_raised() <= set(catalog())
    for entry in catalog().values():
        assert 400 <= entry.status <= 599
        assert entry.type in {
            "invalid_request_error",
            "server_error",
            "authentication_error",
            "permission_error",
        }


def test_every_setting_is_documented() -> None:
    """Every setting's environment variable and flag appear in docs/SETTINGS.md."""
    doc = (ROOT / "docs" / "SETTINGS.md").read_text()
    for name, env, flag, _help in documented():
        assert env or flag, name
        if env:
            assert f"`{env}`" in doc, name
        if flag:
            assert f"`{flag}`" in doc, name


def test_layering_holds() -> None:
    """The layering rules of tools/layering.py hold on this tree, less its listed known
    violations, none of them stale (each rule's own test: tests/unit/test_layering.py)."""
    problems, _ = layering.check(layering.ROOT, layering.KNOWN)
    assert problems == []


def test_the_published_scoring_schema_is_current_and_served(bare_client: TestClient) -> None:
    """OAI-F32-25: millm-scoring-api-v1.json is generated from the server's own definitions
    (tools/schemas.py over spec/openapi/v1.yaml), and the server serves exactly that file."""
    from tools import schemas

    assert schemas.OUT.read_text(encoding="utf-8") == schemas.build()
    served = bare_client.get("/api/schemas/millm-scoring-api-v1.json")
    assert served.status_code == 200 and served.text == schemas.build()
    document = served.json()
    Draft202012Validator.check_schema(document)
    completion = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "system_fingerprint": "millm:m@r:float32/none:transformers",
        "choices": [
            {
                "index": 0,
                "text": " Paris",
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [" Paris"],
                    "token_logprobs": [-0.2],
                    "top_logprobs": [{" Paris": -0.2}],
                    "text_offset": [24],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        "scoring_precision": "float32",
    }
    schema = {**document, "$ref": "#/$defs/Completion"}
    Draft202012Validator(schema).validate(completion)
