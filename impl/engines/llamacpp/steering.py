"""Steering on llama.cpp: a context's control vector, set before each decode (issue 46).

llama.cpp adds a control vector (`llama_set_adapter_cvec`) to a layer's
output: the residual stream after the layer's feed-forward block, the tensor
it names `l_out` (`build_cvec`, then the `l_out` callback name). That is the
output of decoder layer `il` as transformers' `model.layers[il]` returns it,
where the transformers engine's hook adds (transformers/steering.py) and an
SAE with a `resid_post` hook point reads, so the vector Σ strength·W_dec of
miserver.steering.applied goes in unchanged. The vector covers layers 1..n-1
(llama.cpp keeps no slot for layer 0): steering at layer 0 is refused
(`LlamaCppEngine.steerable_layers`, checked by `check_hooks`).

A control vector is one per context, for every token of a decode. So a
sequence's steering is set before each decode that runs its tokens, and rows
steered differently decode in groups, one decode per group (batch.py):
`vectors_of` reads a source as the transformers hooks do, once per pass, so
the source records what ran (its X-miLLM-Steering statement) and an
operator's change reaches a running generation at its next token
(OAI-CONC-01). `ControlVector.set` skips the call when the vectors are the
ones already set (the common case: a steered decode step), and clears the
vector for an unsteered decode, so unsteered tokens compute exactly as they
would with no steering anywhere.
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Mapping
from typing import Any

import llama_cpp
import numpy as np
import torch

from ..base import SteeringSource

Vectors = Mapping[int, torch.Tensor]  # layer -> the vector added to its output this pass
NONE: Vectors = {}


class _Mixed:
    """The key of KV computed under more than one steering state: equal to no other."""

    def __repr__(self) -> str:
        return "MIXED"


MIXED: Hashable = _Mixed()


def vectors_of(source: SteeringSource | None) -> Vectors:
    """What `source` adds in the next pass, by layer (nothing for None), read now: the
    source records the state it gave as applied."""
    if source is None:
        return NONE
    found = {layer: source.vector(layer) for layer in sorted(source.layers())}
    return {layer: vector for layer, vector in found.items() if vector is not None}


def key_of(source: SteeringSource | None) -> Hashable:
    """The steering state a sequence's KV is computed under: () unsteered."""
    return () if source is None else source.key()


def same(a: Vectors, b: Vectors) -> bool:
    """Whether two passes add the same vectors (the same tensors, or equal ones)."""
    if a.keys() != b.keys():
        return False
    return all(a[k] is b[k] or torch.equal(a[k], b[k]) for k in a)


class ControlVector:
    """The control vector of one llama.cpp context (`ctx`, a model of `n_layer` layers of
    width `n_embd`)."""

    def __init__(self, ctx: Any, n_embd: int, n_layer: int) -> None:
        self._ctx = ctx
        self._n_embd = n_embd
        self._n_layer = n_layer
        self._data = np.zeros((max(n_layer - 1, 1), n_embd), dtype=np.float32)
        self._set: Vectors = NONE

    def set(self, vectors: Vectors) -> None:
        """Add `vectors` at the next decodes (NONE: nothing)."""
        if same(vectors, self._set):
            return
        if not vectors:
            status = llama_cpp.llama_set_adapter_cvec(self._ctx, None, 0, self._n_embd, -1, -1)
        else:
            self._data.fill(0.0)
            for layer, vector in vectors.items():
                self._data[layer - 1] = vector.detach().to("cpu", torch.float32).numpy()
            pointer = self._data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            first, last = min(vectors), max(vectors)
            status = llama_cpp.llama_set_adapter_cvec(
                self._ctx, pointer, self._data.size, self._n_embd, first, last
            )
        if status != 0:
            self._set = NONE
            raise RuntimeError(f"llama_set_adapter_cvec failed ({status})")
        self._set = dict(vectors)
