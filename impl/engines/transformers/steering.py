"""Steering hooks: add a steering vector to decoder layers' outputs.

The vector is added at every position the layer computes: the prompt's
prefill and every KV-cached decode step alike (each step runs the layer on
the new token, and the hook sees it), so no part of a generation escapes
the steering. The hook asks its source for the vector at every pass, so a
change of state (an operator's, OAI-CONC-01) reaches a running generation
at its next token. Hooks live only inside `steered()`: they are removed on
success, error and generator close alike.

The vectors themselves (Σ clamp(strength)·W_dec[i]) are built by
`miserver.steering.applied`; this module only adds them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..base import SteeringSource


def _layers(model: nn.Module) -> Sequence[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("this model has no `model.layers` to steer")
    return list(layers)


def _add(output: Any, vector: torch.Tensor) -> Any:
    if isinstance(output, tuple):
        return (output[0] + vector.to(output[0].dtype), *output[1:])
    return output + vector.to(output.dtype)


def _adder(source: SteeringSource, layer: int) -> Any:
    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        vector = source.vector(layer)
        return None if vector is None else _add(output, vector)

    return hook


def _row_adder(sources: Sequence[SteeringSource | None], layer: int) -> Any:
    """A hook adding row r's own vector to row r of a batch ([rows, tokens, width]); rows
    whose source has none at this layer get nothing."""

    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        vectors = [
            None if s is None or layer not in s.layers() else s.vector(layer) for s in sources
        ]
        found = [v for v in vectors if v is not None]
        if not found:
            return None
        zero = torch.zeros_like(found[0])
        rows = torch.stack([zero if v is None else v.to(zero.dtype) for v in vectors])
        return _add(output, rows[:, None, :])

    return hook


def hooked_layer(model: nn.Module, layer: int) -> nn.Module:
    """Decoder layer `layer`, where hooks steer and captures read; IndexError outside."""
    modules = _layers(model)
    if not 0 <= layer < len(modules):
        raise IndexError(f"layer {layer} is outside 0..{len(modules) - 1}")
    return modules[layer]


def _hooked(model: nn.Module, layers: frozenset[int], make: Any) -> list[Any]:
    """Forward hooks `make(layer)` on `layers`, after checking every one exists."""
    modules = [hooked_layer(model, layer) for layer in sorted(layers)]
    return [
        module.register_forward_hook(make(layer))
        for module, layer in zip(modules, sorted(layers), strict=True)
    ]


@contextmanager
def steered(model: nn.Module, source: SteeringSource) -> Iterator[None]:
    """Hooks adding the source's vectors while the block runs; none left after it."""
    handles = []
    try:
        handles = _hooked(model, source.layers(), lambda layer: _adder(source, layer))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def steered_rows(model: nn.Module, sources: Sequence[SteeringSource | None]) -> Iterator[None]:
    """Hooks adding each batch row's own vectors (`sources[r]` for row r, None: unsteered)
    while the block runs; none left after it, nor any when no row is steered."""
    layers = frozenset().union(*(s.layers() for s in sources if s is not None))
    handles = []
    try:
        handles = _hooked(model, layers, lambda layer: _row_adder(sources, layer))
        yield
    finally:
        for handle in handles:
            handle.remove()
