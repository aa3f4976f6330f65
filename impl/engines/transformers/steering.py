"""Steering hooks: add a steering vector to decoder layers' outputs.

The vector is added at every position the layer computes: the prompt's
prefill and every KV-cached decode step alike (each step runs the layer on
the new token, and the hook sees it), so no part of a generation escapes
the steering. The hook asks its source for the vector at every pass, so a
change of state (an operator's, OAI-CONC-01) reaches a running generation
at its next token. Hooks live only inside `steered()`: they are removed on
success, error and generator close alike.

The vectors themselves (Σ clamp(strength)·W_dec[i]) are built by
`miserver.steering.applied`, in the SAE's float32 on the host; this module only adds
them, each copied once to the layer's device and type (`Placed`: a snapshot's vector is
one tensor for as long as the snapshot stands, so a pass adds it with no copy).
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


class Placed:
    """Host vectors copied to a device and type, once each: the last `KEEP` are held, keyed
    by the vector's identity (each entry holds its vector, so the id stays its own)."""

    KEEP = 64

    def __init__(self) -> None:
        self._made: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, ...]] = {}

    def __call__(self, vector: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if vector.device == like.device and vector.dtype == like.dtype:
            return vector
        key = (id(vector), like.device, like.dtype)
        found = self._made.get(key)
        if found is None:
            found = (vector, vector.to(device=like.device, dtype=like.dtype))
            self._made[key] = found
            if len(self._made) > self.KEEP:
                del self._made[next(iter(self._made))]
        return found[1]


_placed = Placed()  # used from the engine's one worker thread


def _hidden(output: Any) -> torch.Tensor:
    hidden: torch.Tensor = output[0] if isinstance(output, tuple) else output
    return hidden


def _add(output: Any, delta: torch.Tensor) -> Any:
    """`output` with `delta` (already on its device and type) added to its hidden states."""
    if isinstance(output, tuple):
        return (output[0] + delta, *output[1:])
    return output + delta


def _adder(source: SteeringSource, layer: int) -> Any:
    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        vector = source.vector(layer)
        return None if vector is None else _add(output, _placed(vector, _hidden(output)))

    return hook


def _row_adder(sources: Sequence[SteeringSource | None], layer: int) -> Any:
    """A hook adding row r's own vector to row r of a batch ([rows, tokens, width]); rows
    whose source has none at this layer get nothing."""

    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        vectors = [
            None if s is None or layer not in s.layers() else s.vector(layer) for s in sources
        ]
        if all(v is None for v in vectors):
            return None
        hidden = _hidden(output)
        zero = hidden.new_zeros(hidden.shape[-1])
        rows = torch.stack([zero if v is None else _placed(v, hidden) for v in vectors])
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
