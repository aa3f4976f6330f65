"""Reading decoder layers' outputs while a generation runs: activations (OAI-ACT) and the
values probes read (`monitored`, `monitored_rows`; engines/monitor.py).

`captured(model, layer, pre_steering=...)` hooks decoder layer `layer` for
the block and keeps the residual stream it outputs at every position it
computes: the prompt's prefill, then each token fed back. A capturing
generation reuses no kept KV prefix (the engine sees to it), so the prefill
covers every prompt position, and the last sampled token, never fed back,
has no row (OAI-ACT-05).

Where it reads, relative to this layer's steering hook (steering.py):

- `pre_steering`: before this layer's own delta. The hook goes ahead of every
  hook on the layer (`prepend`), so it sees what the block computed.
- post steering (the default): after it. The hook goes after every hook
  already on the layer, so `captured` must be entered inside `steered()`.

Steering at earlier layers is in both (OAI-ACT-10). Rows are copied out as
float32 as they come, one small tensor per pass, on the model's device (issue 48:
the SAE encodes them there, and only the features the wire reports reach the host);
`rows()` joins them once, for one batched encoding per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import torch
from torch import nn

from ..monitor import Monitor
from .steering import hooked_layer


class Residuals:
    """The rows one layer output during a capture, in the order the positions ran."""

    def __init__(self, layer: int, *, pre_steering: bool) -> None:
        self.layer = layer
        self.pre_steering = pre_steering
        self._parts: list[torch.Tensor] = []

    def __len__(self) -> int:
        return sum(part.shape[0] for part in self._parts)

    def hook(self, _module: nn.Module, _args: Any, output: Any) -> None:
        """A forward hook: keep this pass's rows (a batch of one), change nothing."""
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.dim() != 3 or hidden.shape[0] != 1:
            raise ValueError(f"a capture reads a batch of one, not {tuple(hidden.shape)}")
        self._parts.append(hidden[0].detach().to(torch.float32, copy=True))

    def rows(self) -> torch.Tensor:
        """Every row so far, [positions, width] (no positions: [0, 0])."""
        if not self._parts:
            return torch.zeros(0, 0)
        return torch.cat(self._parts)


@contextmanager
def captured(model: nn.Module, layer: int, *, pre_steering: bool) -> Iterator[Residuals]:
    """Layer `layer`'s output rows while the block runs; the hook is gone after it."""
    residuals = Residuals(layer, pre_steering=pre_steering)
    module = hooked_layer(model, layer)
    handle = module.register_forward_hook(residuals.hook, prepend=pre_steering)
    try:
        yield residuals
    finally:
        handle.remove()


def _hidden(output: Any) -> torch.Tensor:
    hidden = output[0] if isinstance(output, tuple) else output
    return cast(torch.Tensor, hidden)


@contextmanager
def _reading(
    model: nn.Module, layers: Sequence[int], hook_for: Callable[[int], Callable[..., None]]
) -> Iterator[None]:
    """`hook_for(layer)` on each of `layers` for the block, ahead of every hook already there
    (`prepend`): probes read before the layer's steering delta."""
    handles = [
        hooked_layer(model, layer).register_forward_hook(hook_for(layer), prepend=True)
        for layer in layers
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def monitored(model: nn.Module, monitor: Monitor) -> AbstractContextManager[None]:
    """Feed `monitor` from each of its layers (a batch of one) while the block runs."""

    def hook_for(layer: int) -> Callable[[nn.Module, Any, Any], None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            hidden = _hidden(output)
            if hidden.dim() != 3 or hidden.shape[0] != 1:
                raise ValueError(f"a monitor reads a batch of one, not {tuple(hidden.shape)}")
            monitor.feed(layer, hidden[0].detach().float())

        return hook

    return _reading(model, monitor.layers, hook_for)


def monitored_rows(
    model: nn.Module, monitors: Sequence[Monitor | None]
) -> AbstractContextManager[None]:
    """One step of a batch: row i's newest position feeds `monitors[i]` (None: a row no
    probe reads)."""
    layers = sorted({layer for m in monitors if m is not None for layer in m.layers})

    def hook_for(layer: int) -> Callable[[nn.Module, Any, Any], None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            hidden = _hidden(output)
            for i, monitor in enumerate(monitors):
                if monitor is not None:
                    monitor.feed(layer, hidden[i, -1:].detach().float())

        return hook

    return _reading(model, layers, hook_for)
