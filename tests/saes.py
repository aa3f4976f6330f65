"""Small SAELens-layout SAEs written for the tests: a cfg.json and random weights.

`cfg_for(architecture)` is a SAELens >= 6 cfg.json (`D_IN` inputs, `D_SAE`
features, hooked at block 3); `weights_for(architecture, seed)` its seeded random
weights (a threshold for jumprelu); `write_sae(folder, cfg, weights)` writes
either or both, so a test can leave one out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

D_IN, D_SAE = 8, 16


def cfg_for(architecture: str, **extra: Any) -> dict[str, Any]:
    """A SAELens >= 6 cfg.json (hook fields under metadata only)."""
    cfg: dict[str, Any] = {
        "architecture": architecture,
        "d_in": D_IN,
        "d_sae": D_SAE,
        "dtype": "float32",
        "metadata": {"hook_name": "blocks.3.hook_resid_post", "model_name": "tiny"},
    }
    if architecture == "topk":
        cfg["k"] = 3
    return {**cfg, **extra}


def weights_for(architecture: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weights = {
        "W_enc": torch.randn(D_IN, D_SAE, generator=g),
        "W_dec": torch.randn(D_SAE, D_IN, generator=g),
        "b_enc": torch.randn(D_SAE, generator=g),
        "b_dec": torch.randn(D_IN, generator=g),
    }
    if architecture == "jumprelu":
        weights["threshold"] = torch.full((D_SAE,), 0.5)
    return weights


def write_sae(
    folder: Path, cfg: dict[str, Any] | None, weights: dict[str, torch.Tensor] | None
) -> Path:
    folder.mkdir(parents=True)
    if cfg is not None:
        (folder / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")
    if weights is not None:
        save_file(weights, str(folder / "sae_weights.safetensors"))
    return folder
