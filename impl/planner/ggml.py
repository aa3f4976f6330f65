"""llama.cpp's own CPU kernels, called through ggml's C API for the planner's kernel probe.

llama-cpp-python ships ggml as shared libraries beside libllama; the few
calls bound here build a graph of matrix products on weights quantized to a
type the model uses and compute it on N threads, as llama.cpp's decode does.
They run only in the probe's child process (planner/kernels.py): a misuse
ends that process, never the server.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

F32 = 0
FILL_ROWS = 256  # rows of a matrix made and quantized; the rest repeat them
_void = ctypes.c_void_p
_i64 = ctypes.c_int64


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _void), ("no_alloc", ctypes.c_bool)]


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    import llama_cpp  # loads the libraries first, so the handles below are the same ones

    folder = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(folder / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(folder / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    signatures = {
        "ggml_init": ([_InitParams], _void),
        "ggml_free": ([_void], None),
        "ggml_new_tensor_2d": ([_void, ctypes.c_int, _i64, _i64], _void),
        "ggml_quantize_chunk": (
            [ctypes.c_int, _void, _void, _i64, _i64, _i64, _void],
            ctypes.c_size_t,
        ),
        "ggml_quantize_requires_imatrix": ([ctypes.c_int], ctypes.c_bool),
        "ggml_row_size": ([ctypes.c_int, _i64], ctypes.c_size_t),
        "ggml_nbytes": ([_void], ctypes.c_size_t),
        "ggml_get_data": ([_void], _void),
        "ggml_mul_mat": ([_void, _void, _void], _void),
        "ggml_rms_norm": ([_void, _void, ctypes.c_float], _void),
        "ggml_mul": ([_void, _void, _void], _void),
        "ggml_add": ([_void, _void, _void], _void),
        "ggml_silu": ([_void, _void], _void),
        "ggml_new_graph_custom": ([_void, ctypes.c_size_t, ctypes.c_bool], _void),
        "ggml_build_forward_expand": ([_void, _void], None),
    }
    for name, (args, result) in signatures.items():
        function = getattr(base, name)
        function.argtypes, function.restype = args, result
    cpu.ggml_graph_compute_with_ctx.argtypes = [_void, _void, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_cpu_init.argtypes, cpu.ggml_cpu_init.restype = [], None
    cpu.ggml_cpu_init()
    return base, cpu


class Graph:
    """One ggml context and graph: weights made once, computed as often as timed."""

    def __init__(self, memory: int, nodes: int) -> None:
        self._base, self._cpu = _libraries()
        self._ctx = self._base.ggml_init(_InitParams(memory + (32 << 20), None, False))
        if not self._ctx:
            raise MemoryError(f"ggml could not allocate {memory} bytes")
        self._graph = self._base.ggml_new_graph_custom(self._ctx, nodes + 64, False)

    def close(self) -> None:
        self._base.ggml_free(self._ctx)

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def tensor(self, kind: int, width: int, rows: int) -> int:
        return int(self._base.ggml_new_tensor_2d(self._ctx, kind, width, rows))

    def fill(self, tensor: int, kind: int, width: int, rows: int, seed: int = 0) -> None:
        """Random values quantized to `kind` as llama.cpp's quantizer writes them: FILL_ROWS
        rows made, then repeated (the kernels' speed does not depend on the values)."""
        made = min(rows, FILL_ROWS)
        values = np.random.default_rng(seed).random((made, width), dtype=np.float32) - 0.5
        target = self._base.ggml_get_data(tensor)
        if kind == F32:
            ctypes.memmove(target, values.ctypes.data, values.nbytes)
        else:
            weights = np.ones(width, dtype=np.float32)  # an importance matrix where needed
            needs = self._base.ggml_quantize_requires_imatrix(kind)
            imatrix = weights.ctypes.data if needs else None
            self._base.ggml_quantize_chunk(
                kind, values.ctypes.data, target, 0, made, width, imatrix
            )
        step = made * row_bytes(kind, width)
        whole = rows * row_bytes(kind, width)
        for offset in range(step, whole, step):
            ctypes.memmove(target + offset, target, min(step, whole - offset))

    def copy(self, tensor: int, source: int) -> None:
        size = self._base.ggml_nbytes(source)
        ctypes.memmove(self._base.ggml_get_data(tensor), self._base.ggml_get_data(source), size)

    def matmul(self, weight: int, x: int) -> None:
        self._base.ggml_build_forward_expand(
            self._graph, self._base.ggml_mul_mat(self._ctx, weight, x)
        )

    def chain(self, x: int, scale: int, links: int) -> None:
        """`links` rounds of the small operations of a layer (norm, scale, activation,
        residual add), each reading the last: nodes that cost their dispatch and the
        threads' barrier more than their arithmetic."""
        b = self._base
        for _ in range(links):
            y = b.ggml_mul(self._ctx, b.ggml_rms_norm(self._ctx, x, 1e-5), scale)
            x = b.ggml_add(self._ctx, b.ggml_silu(self._ctx, y), x)
        b.ggml_build_forward_expand(self._graph, x)

    def ones(self, width: int, rows: int) -> int:
        tensor = self.tensor(F32, width, rows)
        values = np.ones((rows, width), dtype=np.float32)
        ctypes.memmove(self._base.ggml_get_data(tensor), values.ctypes.data, values.nbytes)
        return tensor

    def seconds(self, threads: int, run_s: float) -> float:
        """The fastest whole computation of the graph on `threads` in about `run_s`."""
        self._compute(threads)
        best, started = float("inf"), time.perf_counter()
        while True:
            began = time.perf_counter()
            self._compute(threads)
            best = min(best, time.perf_counter() - began)
            if time.perf_counter() - started >= run_s:
                return max(best, 1e-9)

    def _compute(self, threads: int) -> None:
        status = self._cpu.ggml_graph_compute_with_ctx(self._ctx, self._graph, threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute ended with status {status}")


def products(
    matrices: Sequence[tuple[int, int, int]],
    copies: int,
    columns: int,
    threads: Sequence[int],
    run_s: float,
) -> dict[int, float]:
    """Seconds for `copies` of every (rows, width, ggml type) matrix times `columns` float32
    columns, on each thread count (the copies outgrow the caches, as a model's layers do)."""
    with Graph(_bytes(matrices, copies, columns), 2 * copies * len(matrices)) as graph:
        inputs: dict[int, int] = {}
        for index, (rows, width, kind) in enumerate(matrices):
            x = inputs.get(width) or inputs.setdefault(width, graph.ones(width, columns))
            first = graph.tensor(kind, width, rows)
            graph.fill(first, kind, width, rows, seed=index)
            graph.matmul(first, x)
            for _ in range(copies - 1):
                weight = graph.tensor(kind, width, rows)
                graph.copy(weight, first)
                graph.matmul(weight, x)
        return {t: graph.seconds(t, run_s) for t in threads}


def small_ops(width: int, links: int, threads: Sequence[int], run_s: float) -> dict[int, float]:
    """Seconds a node of a chain of a layer's small operations takes, on each thread count."""
    with Graph(8 * links * width * 4, 4 * links) as graph:
        graph.chain(graph.ones(width, 1), graph.ones(width, 1), links)
        return {t: graph.seconds(t, run_s) / (4 * links) for t in threads}


def _bytes(matrices: Sequence[tuple[int, int, int]], copies: int, columns: int) -> int:
    weights = sum(copies * rows * row_bytes(kind, width) for rows, width, kind in matrices)
    outputs = sum(copies * rows * columns * 4 for rows, _, _ in matrices)
    inputs = sum(width * columns * 4 for _, width, _ in matrices)
    return weights + outputs + inputs + (len(matrices) * copies + 8) * 1024


def row_bytes(kind: int, width: int) -> int:
    return int(_libraries()[0].ggml_row_size(kind, width))
