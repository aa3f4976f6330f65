"""Loading a `TransformersEngine` from an HF folder or a GGUF file."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..base import DEFAULT_LOAD, ENGINE_NAMES, EngineId, LoadOptions, ModelFacts
from ..cores import usable_cores
from ..prompt_cache import prompt_cache
from ..rows import chunk_of, parallel_of
from .conversion import Provenance, cached_hf_folder, read_provenance
from .device import DeviceUnavailable, Placement, resolve_device, resolve_dtype
from .engine import CAPABILITIES, ENCODER_CAPABILITIES, TransformersEngine
from .float32 import Float32Settings

logger = logging.getLogger(__name__)

UNRECORDED = "unrecorded"
_HEX = re.compile(r"[0-9a-f]{8,}")


def load_transformers_engine(
    path: Path,
    *,
    model_id: str,
    cache_dir: Path,
    progress: Callable[[str], None] | None = None,
    owned_by: str = "local",
    options: LoadOptions = DEFAULT_LOAD,
    float32: Float32Settings | None = None,
    encoder: bool = False,
) -> TransformersEngine:
    """Load the model at `path` (HF folder or `.gguf` file) on `options.device` in
    `options.dtype` (device.py: auto is the first CUDA device, else the CPU; float32 on the
    CPU, a half type on a GPU); a device or type this process cannot use is turned off
    with a warning (the CPU, float16), as LOC-LOAD-12 turns settings off.

    `options.threads` sets torch's (process-wide) thread count for forward passes, 0 the
    physical cores this process may use (`..cores`); `options.ctx_size` > 0 shortens the
    context the server serves (never past the model's own).
    `options.parallel` > 1 decodes that many rows together (`batch.py`), 0 (auto)
    `rows.rows_for` the context.
    `batch_size`, `mmap` and `mlock` are llama.cpp's and change nothing here.
    """
    report = _reporter(progress)
    torch.set_num_threads(options.threads or usable_cores())
    folder = path
    if path.is_file() and path.suffix == ".gguf":
        folder = cached_hf_folder(path, cache_dir, report)
    report(f"loading {model_id} from {folder}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model, place = _model(folder, options, report, encoder=encoder)
    facts = model_facts(model, tokenizer, folder, model_id=model_id, owned_by=owned_by)
    facts = replace(facts, threads=torch.get_num_threads(), device=place.name)
    if 0 < options.ctx_size < facts.context_length:
        facts = replace(facts, context_length=options.ctx_size)
    report(f"loaded {model_id} ({facts.dtype}/{facts.quantization}@{facts.revision})")
    capabilities = ENCODER_CAPABILITIES if encoder else CAPABILITIES
    ends = eos_ids(model, tokenizer)
    facts = replace(facts, eog_ids=tuple(sorted(ends)))
    return TransformersEngine(
        model,
        tokenizer,
        facts,
        ends,
        float32=float32,
        capabilities=capabilities,
        parallel=1 if encoder else parallel_of(options.parallel, facts.context_length),
        cache=None if encoder else prompt_cache(options.cache_ram),
        chunk=chunk_of(options.prefill_chunk),
    )


def _model(
    folder: Path, options: LoadOptions, report: Callable[[str], None], *, encoder: bool
) -> tuple[PreTrainedModel, Placement]:
    """The model in `folder`, loaded in its type and moved to its device."""
    place = _placement(options, AutoConfig.from_pretrained(folder), report)
    loaded = (AutoModel if encoder else AutoModelForCausalLM).from_pretrained(
        folder, dtype=place.dtype
    )
    return loaded.to(place.device), place  # type: ignore[arg-type]


def _placement(
    options: LoadOptions, config: PretrainedConfig, report: Callable[[str], None]
) -> Placement:
    """Where and in which type the model runs; what cannot be had is turned off, warned."""
    try:
        device = resolve_device(options.device)
    except DeviceUnavailable as exc:
        logger.warning("%s: the model loads on the CPU instead", exc)
        report(f"{exc}: loading on the CPU")
        device = torch.device("cpu")
    dtype = resolve_dtype(options.dtype, device, _stored_dtype(config))
    if options.dtype != "auto" and dtype != getattr(torch, options.dtype):
        logger.warning(
            "%s cannot compute in %s: the model loads in %s", device, options.dtype, dtype
        )
    return Placement(device, dtype)


def _stored_dtype(config: PretrainedConfig) -> torch.dtype | None:
    """The checkpoint's own type, when its config names one."""
    named = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(named, str):
        named = getattr(torch, named, None)
    return named if isinstance(named, torch.dtype) else None


def _reporter(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    def report(message: str) -> None:
        logger.info("%s", message)
        if progress is not None:
            progress(message)

    return report


def model_facts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    folder: Path,
    *,
    model_id: str,
    owned_by: str,
) -> ModelFacts:
    """What the loaded model says about itself, `unrecorded` where unknown."""
    config = model.config
    provenance = read_provenance(folder)
    return ModelFacts(
        model_id=model_id,
        engine=ENGINE_NAMES[EngineId.TRANSFORMERS],
        context_length=int(getattr(config, "max_position_embeddings", 0) or 0),
        vocab_size=int(config.vocab_size),
        dtype=str(model.dtype).removeprefix("torch."),
        quantization=_quantization(config, provenance),
        revision=_revision(config, folder, provenance),
        owned_by=owned_by,
        has_chat_template=bool(tokenizer.chat_template),
        d_model=int(getattr(config, "hidden_size", 0) or 0),
        n_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
    )


def _quantization(config: PretrainedConfig, provenance: Provenance | None) -> str:
    if provenance is not None:
        return provenance.quantization
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return "none"
    method = getattr(quantization, "quant_method", None)
    if method is None and isinstance(quantization, dict):
        method = quantization.get("quant_method")
    return str(method) if method else UNRECORDED


def _revision(config: PretrainedConfig, folder: Path, provenance: Provenance | None) -> str:
    """8 hex chars: the GGUF fingerprint, the commit hash, or `unrecorded`."""
    if provenance is not None:
        return provenance.revision
    candidates = [getattr(config, "_commit_hash", None)]
    if folder.parent.name == "snapshots":  # the Hugging Face hub cache layout
        candidates.append(folder.name)
    for candidate in candidates:
        if isinstance(candidate, str) and _HEX.fullmatch(candidate):
            return candidate[:8]
    return UNRECORDED


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every EOS id the generation config names, else the tokenizer's."""
    generation_config = getattr(model, "generation_config", None)
    ids = _as_ids(getattr(generation_config, "eos_token_id", None))
    if not ids:
        ids = _as_ids(tokenizer.eos_token_id)
    return frozenset(ids)


def _as_ids(value: int | Iterable[int] | None) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}
