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

from torch import nn

from ..base import SteeringSource


def _layers(model: nn.Module) -> Sequence[nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("this model has no `model.layers` to steer")
    return list(layers)


def _adder(source: SteeringSource, layer: int) -> Any:
    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        vector = source.vector(layer)
        if vector is None:
            return None
        if isinstance(output, tuple):
            return (output[0] + vector.to(output[0].dtype), *output[1:])
        return output + vector.to(output.dtype)

    return hook


@contextmanager
def steered(model: nn.Module, source: SteeringSource) -> Iterator[None]:
    """Hooks adding the source's vectors while the block runs; none left after it."""
    layers = _layers(model)
    handles = []
    try:
        for layer in sorted(source.layers()):
            if not 0 <= layer < len(layers):
                raise IndexError(f"layer {layer} is outside 0..{len(layers) - 1}")
            handles.append(layers[layer].register_forward_hook(_adder(source, layer)))
        yield
    finally:
        for handle in handles:
            handle.remove()
