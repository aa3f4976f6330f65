"""Regenerate `generated/` from `spec/openapi/*.yaml` with datamodel-codegen.

    python -m tools.codegen           # write generated/
    python -m tools.codegen --check   # exit 1 when generated/ is stale

The output is byte-identical across reruns (no timestamp), so CI can diff it.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = {name: ROOT / "spec" / "openapi" / f"{name}.yaml" for name in ("v1", "api")}
OUT = ROOT / "generated"
HEADER = '"""Pydantic models generated from spec/ by tools/codegen. Never edit by hand."""\n'
OPTIONS = [
    "--input-file-type",
    "openapi",
    "--output-model-type",
    "pydantic_v2.BaseModel",
    "--target-python-version",
    "3.11",
    "--disable-timestamp",
    "--use-standard-collections",
    "--use-union-operator",
    "--use-annotated",
    "--field-constraints",
    "--use-double-quotes",
    "--enum-field-as-literal",
    "all",
    "--extra-fields",
    "allow",
    "--collapse-root-models",
    "--strict-nullable",
    "--formatters",
    "ruff-format",
]

log = logging.getLogger("codegen")


def render(spec: Path) -> str:
    """The module datamodel-codegen writes for one OpenAPI document."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "models.py"
        cmd = [
            sys.executable,
            "-m",
            "datamodel_code_generator",
            "--input",
            str(spec),
            "--output",
            str(out),
            *OPTIONS,
        ]
        subprocess.run(cmd, check=True, cwd=ROOT)
        return out.read_text(encoding="utf-8")


def expected() -> dict[Path, str]:
    """Every file of generated/ as it should be."""
    files = {OUT / "__init__.py": HEADER}
    for name, spec in SPECS.items():
        files[OUT / f"{name}.py"] = render(spec)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when generated/ is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stale = []
    for path, text in expected().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        log.error("generated/ is stale, run `python -m tools.codegen`: %s", stale)
        return 1
    log.info("generated/ %s", "is current" if not stale else f"rewritten: {stale}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
