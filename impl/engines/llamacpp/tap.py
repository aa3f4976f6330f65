"""Reading layers' outputs on llama.cpp through a context's evaluation callback (issue 46).

llama.cpp names the residual stream a decoder layer outputs `l_out-<il>`
(after its feed-forward block, and after the control vector steering adds
there, steering.py). While a context computes a decode, its scheduler asks
the evaluation callback, node by node, whether it wants a tensor's data;
for one it wants, it computes the graph up to that node and hands the tensor
over, then goes on. A `Tap` is that callback, kept for the context's life
once there: each context is made anew with it the first time something reads
on it (the serial one at a generation's first reading, context.py; the
batch's when its first monitored row joins, its sequences' KV carried over,
batch.py), so a server whose requests never read runs no callback at all. It
wants nothing while no reading is open (`want` empty): each node costs one
call from C into Python that returns at once, and the graph runs in one
piece. With layers wanted it answers only for their `l_out`
tensors (a node's name is looked at through its first eight bytes, read in
place, and read whole only where they match) and copies each out as float32
rows [tokens, width], one row per token of the micro-batch in the order the
decode ran them; `take` hands a decode's rows over by layer.

The last layer's `l_out` holds only the rows whose logits are kept (llama.cpp
drops the others before that layer's attention), so a reading of it keeps
every position's logits (`every_row`).

An `Observer` is what one generation reads, its probe monitor and its capture
(engines/base.py `Hooks`), fed from a tap's rows after each decode that ran its
tokens. Probes read, and a `pre_steering` capture keeps, the layer's output
before its own steering delta: the rows less the vector the decode added there
(llama.cpp adds it inside `l_out`), equal to the unsteered sum up to the last
bit of float32 rounding.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import llama_cpp
import numpy as np
import torch
from llama_cpp import _internals
from llama_cpp import llama_cpp as bindings
from llama_cpp._ctypes_extensions import load_shared_library

from ..base import Hooks
from .steering import Vectors

_ggml = load_shared_library("ggml-base", bindings._base_path)  # beside libllama
_ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
_ggml.ggml_get_name.restype = ctypes.c_char_p
_ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
_ggml.ggml_nelements.restype = ctypes.c_int64
_ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
_ggml.ggml_nbytes.restype = ctypes.c_size_t
_ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
_ggml.ggml_is_contiguous.restype = ctypes.c_bool
_ggml.ggml_backend_tensor_get.argtypes = [
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
]
_ggml.ggml_backend_tensor_get.restype = None
_name_at = _ggml["ggml_get_name"]  # the same function, answering the name's address
_name_at.argtypes = [ctypes.c_void_p]
_name_at.restype = ctypes.c_void_p


def _head(name: bytes) -> int:
    """A name's first eight bytes (NUL-padded) as one number, as `_eval` reads them."""
    return int.from_bytes((name + bytes(8))[:8], "little")


def tapped(llama: llama_cpp.Llama, tap: Tap) -> None:
    """Make `llama`'s context anew, as it was made, with `tap` as its evaluation callback
    (llama-cpp-python takes none); the old one, and what its KV held, is freed first."""
    params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
    params.cb_eval = tap.callback
    llama._ctx.close()  # type: ignore[no-untyped-call]
    llama._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)


def tensor_name(layer: int) -> bytes:
    """The name llama.cpp gives decoder layer `layer`'s output."""
    return f"l_out-{layer}".encode()


class Tap:
    """The evaluation callback of one llama.cpp context, for a model of width `n_embd` and
    `n_layer` layers. Pass `callback` as the context's `cb_eval`."""

    def __init__(self, n_embd: int, n_layer: int) -> None:
        self._n_embd = n_embd
        self._n_layer = n_layer
        self._wanted: dict[bytes, int] = {}
        self._heads: frozenset[int] = frozenset()
        self._offset = -1  # where a tensor's name lies in it (learned at the first node)
        self._rows: dict[int, list[np.ndarray]] = {}
        self.failure: str | None = None  # why a tensor could not be read (raised by `take`)
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval)

    @property
    def every_row(self) -> bool:
        """Whether a decode must keep every position's logits: the last layer is read."""
        return self.reads_last(self._wanted.values())

    def reads_last(self, layers: Iterable[int]) -> bool:
        """Whether reading `layers` reads the last one (its rows only where logits are kept)."""
        return self._n_layer - 1 in layers

    def want(self, layers: Iterable[int]) -> None:
        """Read `layers` at the decodes from now on (none: read nothing); drops rows not
        taken."""
        wanted = {tensor_name(layer): layer for layer in sorted(set(layers))}
        if wanted == self._wanted:
            return
        self._wanted = wanted
        self._heads = frozenset(_head(name) for name in wanted)
        self._rows = {layer: [] for layer in self._wanted.values()}
        self.failure = None

    def take(self) -> dict[int, np.ndarray]:
        """The rows each wanted layer output since the last `take`, [tokens, width] float32."""
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise RuntimeError(f"reading a layer's output failed: {failure}")
        taken = {
            layer: np.concatenate(parts) if parts else np.zeros((0, self._n_embd), np.float32)
            for layer, parts in self._rows.items()
        }
        self._rows = {layer: [] for layer in self._rows}
        return taken

    def _eval(self, tensor: Any, ask: bool, _user: Any) -> bool:
        if not self._wanted:
            return False
        if self._offset < 0:
            self._offset = int(_name_at(tensor)) - int(tensor)
        if ctypes.c_uint64.from_address(tensor + self._offset).value not in self._heads:
            return False
        layer = self._wanted.get(_ggml.ggml_get_name(tensor))
        if layer is None:
            return False
        if not ask:
            self._copy(tensor, layer)
        return True

    def _copy(self, tensor: Any, layer: int) -> None:
        count = int(_ggml.ggml_nelements(tensor))
        size = int(_ggml.ggml_nbytes(tensor))
        if size != 4 * count or count % self._n_embd or not _ggml.ggml_is_contiguous(tensor):
            self.failure = f"l_out-{layer} is not contiguous float32 rows of {self._n_embd}"
            return
        rows = np.empty((count // self._n_embd, self._n_embd), dtype=np.float32)
        _ggml.ggml_backend_tensor_get(tensor, rows.ctypes.data, 0, size)
        self._rows[layer].append(rows)


class Observer:
    """What one generation reads from a tap: its monitor's layers and its capture's."""

    def __init__(self, hooks: Hooks) -> None:
        self.monitor = hooks.monitor
        self.capture = hooks.capture
        layers = set() if self.monitor is None else set(self.monitor.layers)
        if self.capture is not None:
            layers.add(self.capture.layer)
        self.layers = tuple(sorted(layers))
        self._captured: list[np.ndarray] = []

    @staticmethod
    def of(hooks: Hooks) -> Observer | None:
        """The observer of `hooks`, None when they read nothing."""
        return None if hooks.monitor is None and hooks.capture is None else Observer(hooks)

    def feed(self, rows: dict[int, np.ndarray], vectors: Vectors) -> None:
        """One decode's rows of this generation's tokens, by layer, run under `vectors`."""
        for layer, found in rows.items():
            vector = vectors.get(layer)
            pre = found if vector is None else found - vector.to(torch.float32).numpy()
            if self.monitor is not None and layer in self.monitor.layers:
                self.monitor.feed(layer, torch.from_numpy(pre))
            capture = self.capture
            if capture is not None and layer == capture.layer:
                self._captured.append(pre if capture.pre_steering else found)

    def record(self) -> None:
        """The capture's rows, every position fed, recorded on it (as the generation ends)."""
        if self.capture is None:
            return
        if not self._captured:
            self.capture.record(torch.zeros(0, 0))
            return
        self.capture.record(torch.from_numpy(np.concatenate(self._captured)))
