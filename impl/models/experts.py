"""How many experts a model uses per token, from its own files (LOC-INFO-15).

A GGUF header says it as `<arch>.expert_used_count`; an HF folder's
`config.json` as `num_experts_per_tok` (at the top, or in `text_config` for
a model that wraps a language model). A dense model names neither: 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engines import gguf

HF_KEY = "num_experts_per_tok"


def experts_used(path: Path) -> int:
    """Experts used per token by the model at `path`; 0 for a dense or unreadable one."""
    if path.is_dir():
        return _from_config(path / "config.json")
    try:
        meta = gguf.facts(path).metadata
    except (OSError, ValueError):
        return 0
    arch = meta.get("general.architecture")
    return _count(meta.get(f"{arch}.expert_used_count")) if isinstance(arch, str) else 0


def _from_config(path: Path) -> int:
    try:
        config = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(config, dict):
        return 0
    nested = config.get("text_config")
    inner = nested.get(HF_KEY) if isinstance(nested, dict) else None
    return _count(config.get(HF_KEY, inner))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
