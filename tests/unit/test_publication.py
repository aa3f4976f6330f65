"""The published contract: what spec/ holds is what the server serves and what
`miserver schemas export` writes, and it carries a version with a CHANGELOG entry (#9)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
DOCUMENTS = {"v1": "/v1/openapi.json", "api": "/api/openapi.json"}


def spec_document(name: str) -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((SPEC / "openapi" / f"{name}.yaml").read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_served_document_is_the_spec_file(bare_client: TestClient, name: str) -> None:
    """The OpenAPI documents are served as the files in spec/ say, references unresolved and
    servers unchanged, so a client generated from either is the same client."""
    response = bare_client.get(DOCUMENTS[name])
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == spec_document(name)


def test_every_published_schema_is_served_byte_for_byte(bare_client: TestClient) -> None:
    """Each JSON Schema in spec/schemas/ is served at /api/schemas/<name>; others are 4xx."""
    names = sorted(path.name for path in (SPEC / "schemas").glob("*.json"))
    assert names
    for name in names:
        served = bare_client.get(f"/api/schemas/{name}")
        assert served.status_code == 200
        assert served.content == (SPEC / "schemas" / name).read_bytes()
    assert bare_client.get("/api/schemas/nothing.json").status_code in (400, 404)


def test_schemas_export_writes_the_contract(tmp_path: Path) -> None:
    """`miserver schemas export DIR` writes both documents (YAML byte for byte, and JSON) and
    every JSON Schema."""
    subprocess.run(
        [sys.executable, "-m", "miserver.cli", "schemas", "export", str(tmp_path / "out")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    out = tmp_path / "out"
    for name in DOCUMENTS:
        source = SPEC / "openapi" / f"{name}.yaml"
        assert (out / "openapi" / f"{name}.yaml").read_bytes() == source.read_bytes()
        exported = json.loads((out / "openapi" / f"{name}.json").read_text())
        assert exported == spec_document(name)
    for schema in (SPEC / "schemas").glob("*.json"):
        assert (out / "schemas" / schema.name).read_bytes() == schema.read_bytes()


def test_the_contract_version_has_a_changelog_entry() -> None:
    """Both documents carry the one contract version (`info.version`, semantic), and
    CHANGELOG.md has a section for it under "Contract"."""
    versions = {str(spec_document(name)["info"]["version"]) for name in DOCUMENTS}  # type: ignore[index]
    assert len(versions) == 1
    (version,) = versions
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    contract = changelog.split("## Contract", 1)[1]
    assert re.search(rf"^### {re.escape(version)} ", contract, re.MULTILINE), version
