"""Steering hooks: add Σ strength·W_dec[i] to a decoder layer's output.

The vector is added at every position the layer computes: the prompt's
prefill and every KV-cached decode step alike (each step runs the layer on
the new token, and the hook sees it), so no part of a generation escapes
the steering. Each strength is clamped to ±CLAMP when the vector is built,
and the clamps are counted so the response can report them (OAI-INL-12/13).
Hooks live only inside `steered()`: they are removed on success, error and
generator close alike.

`TransformersEngine.steered()` enters these hooks and keys the kept KV
prefix (prefix.py) by the steering state: steered keys and values are never
reused by a generation under another state. Not wired to requests yet (#4).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...steering.sae import SAE

CLAMP = 200.0


@dataclass(frozen=True, slots=True)
class LayerSteering:
    """One layer's steering: the vector added, and what was applied to build it."""

    layer: int
    vector: torch.Tensor
    applied: Mapping[int, float]
    clamped: int


def clamp(strength: float) -> float:
    return max(-CLAMP, min(CLAMP, float(strength)))


def layer_steering(sae: SAE, strengths: Mapping[int, float]) -> LayerSteering:
    """The vector for `strengths` on `sae` (clamped; zeros, -0.0 included, dropped)."""
    applied: dict[int, float] = {}
    clamped = 0
    for index, strength in strengths.items():
        if isinstance(strength, bool) or not math.isfinite(float(strength)):
            raise ValueError(f"strength of feature {index} must be a finite number")
        if not 0 <= index < sae.d_sae:
            raise IndexError(f"feature {index} is outside 0..{sae.d_sae - 1}")
        value = clamp(strength)
        clamped += value != float(strength)
        if value != 0.0:
            applied[index] = value
    vector = torch.zeros(sae.d_in, dtype=sae.W_dec.dtype)
    for index, value in applied.items():
        vector += value * sae.W_dec[index]
    return LayerSteering(sae.layer, vector, applied, clamped)


def _layers(model: nn.Module) -> Sequence[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("this model has no `model.layers` to steer")
    return list(layers)


def _adder(vector: torch.Tensor) -> Any:
    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] + vector.to(output[0].dtype), *output[1:])
        return output + vector.to(output.dtype)

    return hook


@contextmanager
def steered(model: nn.Module, steering: Sequence[LayerSteering]) -> Iterator[None]:
    """Hooks adding each layer's vector while the block runs; none left after it."""
    layers = _layers(model)
    handles = []
    try:
        for item in steering:
            if not 0 <= item.layer < len(layers):
                raise IndexError(f"layer {item.layer} is outside 0..{len(layers) - 1}")
            if item.applied:
                handles.append(layers[item.layer].register_forward_hook(_adder(item.vector)))
        yield
    finally:
        for handle in handles:
            handle.remove()
