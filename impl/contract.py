"""The published contract: the OpenAPI documents and JSON Schemas in spec/, as served.

    document     file                               served at
    v1           spec/openapi/v1.yaml               GET /v1/openapi.json
    api          spec/openapi/api.yaml              GET /api/openapi.json
    <name>.json  spec/schemas/<name>.json           GET /api/schemas/<name>.json

The documents are served as JSON with exactly the YAML files' content (no
resolved references, no rewritten servers), so a client generated from
`spec/` and one generated from a running server are the same client.
`miserver schemas export DIR` writes every file a sibling project needs.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DOCUMENTS = ("v1", "api")


def _spec() -> Traversable:
    return resources.files("miserver.spec")


@cache
def document(name: str) -> dict[str, Any]:
    """The OpenAPI document `name` (v1 or api) as data."""
    if name not in DOCUMENTS:
        raise KeyError(name)
    text = (_spec() / "openapi" / f"{name}.yaml").read_text("utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def version(name: str) -> str:
    """The contract version the document carries (`info.version`)."""
    return str(document(name)["info"]["version"])


def schema_names() -> list[str]:
    """The published JSON Schemas, by file name."""
    folder = _spec() / "schemas"
    return sorted(item.name for item in folder.iterdir() if item.name.endswith(".json"))


def schema_bytes(name: str) -> bytes:
    """A published JSON Schema, byte for byte."""
    if name not in schema_names():
        raise KeyError(name)
    return (_spec() / "schemas" / name).read_bytes()


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator of the published JSON Schema `name` (for imported documents)."""
    schema = json.loads(schema_bytes(name))
    cls = jsonschema.validators.validator_for(schema)
    checker: jsonschema.protocols.Validator = cls(schema)
    return checker


def first_error(name: str, document: Any) -> tuple[str, str] | None:
    """(field, message) of the first place `document` breaks schema `name`; the field is
    the JSON pointer written as a field name (`members[2].strength`); None when valid."""
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    field = ""
    for part in errors[0].absolute_path:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    return field or "document", errors[0].message


def export(folder: Path) -> list[Path]:
    """Write the contract under `folder`: openapi/{v1,api}.{yaml,json} and schemas/*.json."""
    written: list[Path] = []
    for name in DOCUMENTS:
        source = (_spec() / "openapi" / f"{name}.yaml").read_bytes()
        written.append(_write(folder / "openapi" / f"{name}.yaml", source))
        as_json = json.dumps(document(name), indent=2, ensure_ascii=False) + "\n"
        written.append(_write(folder / "openapi" / f"{name}.json", as_json.encode("utf-8")))
    for schema in schema_names():
        written.append(_write(folder / "schemas" / schema, schema_bytes(schema)))
    return written


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
