"""Will a model fit? Estimates from the files, against the host's available memory.

Estimates are deliberately simple and stated: a GGUF needs its file size
plus its KV cache at the trained window (f16 keys and values); an HF folder
needs its weight files' size; a GGUF served through the transformers
conversion needs its converted float32 size (about 8 bytes per 4.5-bit
weight: 7x the file). MEMORY_BUDGET_MB, when set, replaces the host's
available memory (MemAvailable).
"""

from __future__ import annotations

from pathlib import Path

from ..engines import gguf
from ..engines.base import EngineId
from ..engines.prompt_cache import DEFAULT_MIB
from .registry import ModelEntry

MIB = 1 << 20
CONVERSION_GROWTH = 7
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def available_mib(budget_mb: int = 0, meminfo: Path = Path("/proc/meminfo")) -> int:
    """The memory a model may take: the budget if set, else MemAvailable."""
    if budget_mb > 0:
        return budget_mb
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("MemAvailable is missing from /proc/meminfo")


def _kv_cache_bytes(path: Path) -> int:
    facts = gguf.facts(path)
    meta, arch = facts.metadata, facts.architecture
    layers = int(meta.get(f"{arch}.block_count", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 1)) or 1
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    width = int(meta.get(f"{arch}.embedding_length", 0))
    return facts.context_length * layers * (width // heads) * kv_heads * 2 * 2


def rows_fit(entry: ModelEntry, budget_mb: int = 0) -> bool:
    """Whether `parallel: auto` may batch `entry`: on llama.cpp the rows share the window
    in a context of their own, a second KV cache as large as the serial one, which must fit
    beside the model (`needed_mib`) in the memory available now. transformers' rows grow
    their caches as they decode, as a serial request's does."""
    if entry.engine != EngineId.LLAMACPP:
        return True
    rows_kv = -(-_kv_cache_bytes(entry.path) // MIB)
    return needed_mib(entry) + rows_kv <= available_mib(budget_mb)


def cache_mib(entry: ModelEntry, budget_mb: int = 0) -> int:
    """The prompt cache's size for `cache-ram: auto`: half the memory `entry` leaves once
    loaded (its rows' KV cache counted), at most the engine's default."""
    left = available_mib(budget_mb) - needed_mib(entry)
    if entry.engine == EngineId.LLAMACPP:
        left -= -(-_kv_cache_bytes(entry.path) // MIB)
    return max(0, min(DEFAULT_MIB, left // 2))


def needed_mib(entry: ModelEntry) -> int:
    """The memory `entry` takes once loaded, in MiB (rounded up)."""
    path = entry.path
    if entry.engine == EngineId.LLAMACPP:
        need = path.stat().st_size + _kv_cache_bytes(path)
    elif path.is_dir():
        need = sum(f.stat().st_size for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    else:  # a GGUF file converted for transformers
        need = path.stat().st_size * CONVERSION_GROWTH
    return -(-need // MIB)
