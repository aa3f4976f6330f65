"""Sparse autoencoders in the SAELens folder layout, and the registry of a saes directory.

A folder holds `cfg.json` and `sae_weights.safetensors` (issue #4: SAE registry):

    cfg.json                  architecture ("standard" = ReLU, "jumprelu", "topk"), d_in,
                              d_sae, hook_name / hook_layer (top level, or under
                              "metadata" as SAELens >= 6 writes them), k for topk
    sae_weights.safetensors   W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_enc [d_sae],
                              b_dec [d_in], threshold [d_sae] (jumprelu only)

Anything else is refused with `SAEFormatError`, naming the file and what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu", "topk")
_HOOK_LAYER = re.compile(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.")


class SAEFormatError(ValueError):
    """A folder that is not a usable SAELens-layout SAE, or an SAE that does not fit the model."""


@dataclass(frozen=True, slots=True, eq=False, kw_only=True)
class SAE:
    """One sparse autoencoder: features are `encode(x)`, reconstructions `decode(features)`."""

    sae_id: str
    architecture: str
    d_in: int
    d_sae: int
    layer: int
    hook_name: str
    W_enc: torch.Tensor
    W_dec: torch.Tensor
    b_enc: torch.Tensor
    b_dec: torch.Tensor
    threshold: torch.Tensor | None = None
    k: int | None = None
    apply_b_dec_to_input: bool = True

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations [..., d_sae] of residual vectors x [..., d_in]."""
        x = x.to(self.W_enc.dtype)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        if self.architecture == "jumprelu":
            assert self.threshold is not None
            return torch.relu(pre) * (pre > self.threshold)
        acts = torch.relu(pre)
        if self.architecture == "topk":
            assert self.k is not None
            top = torch.topk(acts, min(self.k, self.d_sae), dim=-1)
            acts = torch.zeros_like(acts).scatter(-1, top.indices, top.values)
        return acts

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """Reconstructed residual vectors [..., d_in] of feature activations [..., d_sae]."""
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def decoder_direction(self, index: int) -> torch.Tensor:
        """Feature `index`'s decoder row [d_in]; IndexError outside 0..d_sae-1 (OAI-INL-08)."""
        if not 0 <= index < self.d_sae:
            raise IndexError(f"feature index {index} is outside 0..{self.d_sae - 1}")
        return self.W_dec[index]


@lru_cache(maxsize=16)
def placed(sae: SAE, device: torch.device) -> SAE:
    """`sae` with its weights on `device` (itself when they are there already), made once
    per SAE and device: readings encode where the model's rows are (issue 48). The
    weights keep their type: an encoding reads float32 rows in the SAE's own precision."""
    if sae.W_enc.device == device:
        return sae
    moved = {name: getattr(sae, name).to(device) for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
    threshold = None if sae.threshold is None else sae.threshold.to(device)
    return replace(sae, threshold=threshold, **moved)


def load_sae(folder: Path, sae_id: str | None = None) -> SAE:
    """The SAE in `folder` (SAELens layout); its id defaults to the folder's name."""
    cfg = _read_cfg(folder / CFG_FILE)
    architecture = _architecture(cfg)
    d_in, d_sae = _positive_int(cfg, "d_in"), _positive_int(cfg, "d_sae")
    hook_name, layer = _hook(cfg)
    weights = _read_weights(folder / WEIGHTS_FILE)
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    if architecture == "jumprelu":
        shapes["threshold"] = (d_sae,)
    _check_shapes(folder / WEIGHTS_FILE, weights, shapes)
    return SAE(
        sae_id=sae_id if sae_id is not None else folder.name,
        architecture=architecture,
        d_in=d_in,
        d_sae=d_sae,
        layer=layer,
        hook_name=hook_name,
        W_enc=weights["W_enc"],
        W_dec=weights["W_dec"],
        b_enc=weights["b_enc"],
        b_dec=weights["b_dec"],
        threshold=weights.get("threshold") if architecture == "jumprelu" else None,
        k=_k(cfg) if architecture == "topk" else None,
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
    )


class SAERegistry:
    """The SAEs of one directory: each subfolder holding a `cfg.json` is one SAE, named by it."""

    def __init__(self, saes_dir: Path) -> None:
        self.saes_dir = saes_dir
        self._loaded: dict[str, SAE] = {}

    def ids(self) -> list[str]:
        """Sorted ids of the SAEs present (none when the directory does not exist)."""
        if not self.saes_dir.is_dir():
            return []
        return sorted(p.name for p in self.saes_dir.iterdir() if (p / CFG_FILE).is_file())

    def get(self, sae_id: str) -> SAE:
        """The SAE `sae_id`, loaded once; KeyError when there is no such SAE."""
        if sae_id not in self._loaded:
            if sae_id not in self.ids():
                raise KeyError(sae_id)
            self._loaded[sae_id] = load_sae(self.saes_dir / sae_id, sae_id)
        return self._loaded[sae_id]

    @staticmethod
    def check_fits(sae: SAE, d_model: int, n_layers: int) -> None:
        """Refuse an SAE whose d_in is not the model's width, or whose layer it lacks."""
        if sae.d_in != d_model:
            raise SAEFormatError(
                f"SAE {sae.sae_id!r} has d_in {sae.d_in} but the model's d_model is {d_model}"
            )
        if not 0 <= sae.layer < n_layers:
            raise SAEFormatError(
                f"SAE {sae.sae_id!r} hooks layer {sae.layer} but the model has {n_layers} layers"
            )


def _read_cfg(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SAEFormatError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SAEFormatError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(cfg, dict):
        raise SAEFormatError(f"{path}: not a JSON object")
    return cfg


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise SAEFormatError(f"{path}: missing")
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise SAEFormatError(f"{path}: not a safetensors file ({exc})") from exc


def _architecture(cfg: dict[str, Any]) -> str:
    """SAELens < 6 spells a TopK SAE as architecture "standard" with activation_fn "topk"."""
    architecture = cfg.get("architecture", "standard")
    if architecture == "standard" and cfg.get("activation_fn_str", "relu") == "topk":
        architecture = "topk"
    if architecture not in ARCHITECTURES:
        raise SAEFormatError(
            f"{CFG_FILE}: unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})"
        )
    return str(architecture)


def _positive_int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SAEFormatError(f"{CFG_FILE}: {key} must be a positive integer, got {value!r}")
    return value


def _hook(cfg: dict[str, Any]) -> tuple[str, int]:
    """hook_name and layer, from the top level or `metadata`; the layer may come from the name."""
    metadata = cfg.get("metadata")
    sources = [cfg, metadata] if isinstance(metadata, dict) else [cfg]
    name = next((s["hook_name"] for s in sources if isinstance(s.get("hook_name"), str)), None)
    if name is None:
        raise SAEFormatError(f"{CFG_FILE}: hook_name is missing")
    layer = next((s["hook_layer"] for s in sources if "hook_layer" in s), None)
    if layer is None and (match := _HOOK_LAYER.search(name)):
        layer = int(match.group(1))
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise SAEFormatError(f"{CFG_FILE}: no layer for hook {name!r} (hook_layer {layer!r})")
    return name, layer


def _k(cfg: dict[str, Any]) -> int:
    kwargs = cfg.get("activation_fn_kwargs")
    k = cfg.get("k", kwargs.get("k") if isinstance(kwargs, dict) else None)
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise SAEFormatError(f"{CFG_FILE}: a topk SAE needs a positive integer k, got {k!r}")
    return k


def _check_shapes(
    path: Path, weights: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]]
) -> None:
    for key, shape in shapes.items():
        if key not in weights:
            raise SAEFormatError(f"{path}: tensor {key} is missing")
        if tuple(weights[key].shape) != shape:
            raise SAEFormatError(
                f"{path}: {key} has shape {list(weights[key].shape)}, expected {list(shape)}"
            )
        if not weights[key].is_floating_point():
            raise SAEFormatError(f"{path}: {key} is {weights[key].dtype}, not floating point")
