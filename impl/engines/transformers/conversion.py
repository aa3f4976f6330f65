"""GGUF files converted once into cached Hugging Face folders.

transformers can load a GGUF (it dequantizes every tensor to float32), but
that takes tens of seconds. `cached_hf_folder` does it once per file and
keeps the result under the cache directory, keyed by a cheap fingerprint of
the file (name, size, and SHA-256 over its first and last MiB). A folder is
written under a temporary name and renamed into place, so a crash never
leaves half a folder where a finished one is expected.

Each converted folder holds `miserver-source.json` (`Provenance`), which says
where the weights came from; `ModelFacts` quotes it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..gguf import facts, fingerprint

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "miserver-source.json"

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a converted folder's weights came from."""

    source: str
    revision: str
    quantization: str
    converter: str


def gguf_quantization(path: Path) -> str:
    """The quantization a GGUF declares (`general.file_type`), e.g. `Q4_1`."""
    return facts(path).quantization


def read_provenance(folder: Path) -> Provenance | None:
    """The provenance recorded in a converted folder, if any."""
    try:
        raw = json.loads((folder / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return Provenance(**raw)


def cached_hf_folder(gguf_path: Path, cache_dir: Path, progress: Progress) -> Path:
    """The HF folder converted from `gguf_path`, converting on first use."""
    digest = fingerprint(gguf_path)
    folder = cache_dir / f"{gguf_path.stem}-{digest[:16]}"
    if (folder / PROVENANCE_FILE).is_file():
        progress(f"using converted folder {folder}")
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache_dir))
    try:
        _convert(gguf_path, staging, digest[:8], progress)
        _publish(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _convert(gguf_path: Path, target: Path, revision: str, progress: Progress) -> None:
    progress(f"converting {gguf_path.name} to a Hugging Face folder (once)")
    directory, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    # The weights are dequantized already; drop the GGUF marks save_pretrained refuses.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress(f"saving converted weights to {target}")
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    provenance = Provenance(
        source=name,
        revision=revision,
        quantization=gguf_quantization(gguf_path),
        converter=f"transformers {transformers.__version__}",
    )
    text = json.dumps(asdict(provenance), indent=2) + "\n"
    (target / PROVENANCE_FILE).write_text(text, encoding="utf-8")


def _publish(staging: Path, folder: Path) -> None:
    """Rename the finished folder into place; a concurrent winner is kept."""
    try:
        os.rename(staging, folder)
    except OSError:
        if not (folder / PROVENANCE_FILE).is_file():
            raise
        logger.info("another process converted %s first; using it", folder.name)
