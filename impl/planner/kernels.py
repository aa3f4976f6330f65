"""The engine's own kernels on this model's shapes, timed in a process of their own
(REQ-003 PLAN-04, -05, -27; issue 21).

A token's decode is its layers' one-row matrix products plus what each layer
costs beyond them. Both are timed here on each candidate thread count, never
loading the model: the product on matrices of the model's shapes and types
(random values; enough copies to outgrow the caches, as the model's layers
do), made by the engine's own kernel, llama.cpp's ggml (planner/ggml.py) or
torch's `linear` in the compute type; and a layer's rest, from a chain of
ggml's small operations a layer runs, or from transformers' own classes of the
model's architecture built narrow (the Python and dispatch cost of a layer,
which does not depend on its width). A prompt-wide product gives the prefill
rate.

The server asks in a child, `miserver serve --probe-kernels ASK` (its JSON
on stdout): threads this probe starts would otherwise stay in the server,
and OpenMP, which llama.cpp and torch share there, spins less at every
barrier once it runs more threads than there are cores (BENCHMARKS.md "The
plan on this machine"). A kernel that ends its process leaves the plan
without a prediction instead of ending the server.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

TARGET_BYTES = 128 << 20  # a matrix set's copies together, past any last-level cache
RUN_S = 0.1  # each timing repeats for about this long
PROMPT_COLUMNS = 256  # the prompt-wide product's tokens
NODES_PER_LAYER = 16  # a llama.cpp layer's computed nodes beside its weight products
LINKS = 64  # rounds of the small-operation chain
NARROW = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 256}
NARROW_LAYERS = (2, 6)  # the narrow model's two depths: a layer is their difference
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

Matrix = tuple[int, int, int]  # rows, width, ggml type (llama.cpp; ignored on transformers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """What to time: one layer's matrices and the output's, on `threads`."""

    engine: str  # "llama.cpp" | "transformers"
    threads: tuple[int, ...]
    layer: tuple[Matrix, ...]
    head: Matrix | None
    n_layer: int
    width: int
    dtype: str = "float32"  # transformers' compute type
    arch: str = "llama"
    config: dict[str, Any] = field(default_factory=dict)  # transformers: the model's config

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Ask:
        data = json.loads(text)
        data["threads"] = tuple(int(t) for t in data["threads"])
        data["layer"] = tuple(tuple(int(x) for x in m) for m in data["layer"])
        data["head"] = tuple(int(x) for x in data["head"]) if data.get("head") else None
        return cls(**data)


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernels:
    """The kernels at one thread count."""

    threads: int
    token_rate: float  # bytes a second of a token's weight products (layers and output)
    layer_s: float  # what a layer costs beyond its weight products
    prompt_flops: float  # FLOP/s of a prompt-wide product


def run(ask: Ask) -> list[Kernels]:
    """Every timing of `ask` (in this process: the child of `--probe-kernels`, or the server
    with `--no-isolated-probes`)."""
    timer = _Ggml() if ask.engine == "llama.cpp" else _Torch(ask.dtype)
    layer, layer_copies = _fitted(ask.layer, timer.size)
    layer_s = timer.products(layer, layer_copies, 1, ask.threads)
    head_s: dict[int, float] = dict.fromkeys(ask.threads, 0.0)
    head_bytes = 0
    if ask.head is not None:
        head, head_copies = _fitted((ask.head,), timer.size)
        head_s = timer.products(head, head_copies, 1, ask.threads)
        head_bytes = _bytes(head, timer.size) * head_copies
    widest = max(ask.layer, key=lambda m: m[0] * m[1])
    prompt, _ = _fitted((widest,), timer.size, copies=False)
    prompt_s = timer.products(prompt, 1, PROMPT_COLUMNS, ask.threads)
    rest = timer.rest(ask)
    model_layer = _bytes(ask.layer, timer.size)
    model_head = 0 if ask.head is None else _bytes((ask.head,), timer.size)
    probe_layer = _bytes(layer, timer.size) * layer_copies
    found = []
    for t in ask.threads:
        seconds = ask.n_layer * model_layer * layer_s[t] / probe_layer
        if head_bytes:
            seconds += model_head * head_s[t] / head_bytes
        rows, width, _ = prompt[0]
        found.append(
            Kernels(
                threads=t,
                token_rate=(ask.n_layer * model_layer + model_head) / seconds,
                layer_s=rest[t],
                prompt_flops=2 * rows * width * PROMPT_COLUMNS / prompt_s[t],
            )
        )
    return found


def _fitted(
    matrices: Sequence[Matrix], size: Callable[[Matrix], int], copies: bool = True
) -> tuple[tuple[Matrix, ...], int]:
    """`matrices`, fewer rows each when together they pass TARGET_BYTES, and how many
    copies of them reach it."""
    total = _bytes(matrices, size)
    if total > TARGET_BYTES:
        share = TARGET_BYTES / total
        matrices = tuple((max(16, int(r * share)), w, k) for r, w, k in matrices)
        total = _bytes(matrices, size)
    return tuple(matrices), max(1, math.ceil(TARGET_BYTES / total)) if copies else 1


def _bytes(matrices: Sequence[Matrix], size: Callable[[Matrix], int]) -> int:
    return sum(size(m) for m in matrices)


class _Ggml:
    """llama.cpp's kernels."""

    def __init__(self) -> None:
        from . import ggml

        self._ggml = ggml

    def size(self, matrix: Matrix) -> int:
        rows, width, kind = matrix
        return rows * self._ggml.row_bytes(kind, width)

    def products(
        self, matrices: Sequence[Matrix], copies: int, columns: int, threads: Sequence[int]
    ) -> dict[int, float]:
        return self._ggml.products(matrices, copies, columns, threads, RUN_S)

    def rest(self, ask: Ask) -> dict[int, float]:
        per_node = self._ggml.small_ops(ask.width, LINKS, ask.threads, RUN_S)
        return {t: s * NODES_PER_LAYER for t, s in per_node.items()}


class _Torch:
    """transformers' kernels: torch's `linear` in the compute type, and the model's own
    classes built narrow."""

    def __init__(self, dtype: str) -> None:
        import torch

        self._torch = torch
        self._dtype = getattr(torch, dtype if dtype in DTYPE_BYTES else "float32")
        self._bytes = DTYPE_BYTES.get(dtype, 4)

    def size(self, matrix: Matrix) -> int:
        rows, width, _ = matrix
        return rows * width * self._bytes

    def products(
        self, matrices: Sequence[Matrix], copies: int, columns: int, threads: Sequence[int]
    ) -> dict[int, float]:
        torch = self._torch
        linear = torch.nn.functional.linear
        with torch.inference_mode():
            weights = [  # the values do not change the speed: a constant is made at once
                torch.full((rows, width), 0.01, dtype=self._dtype)
                for _ in range(copies)
                for rows, width, _ in matrices
            ]
            inputs = {w: torch.full((columns, w), 0.5, dtype=self._dtype) for _, w, _ in matrices}

            def kernel() -> None:
                for weight in weights:
                    linear(inputs[weight.shape[1]], weight)

            return {t: self._timed(kernel, t) for t in threads}

    def rest(self, ask: Ask) -> dict[int, float]:
        """A layer's cost at the narrow width, from two depths of the narrow model."""
        models = [self._narrow(ask, layers) for layers in NARROW_LAYERS]
        found = {}
        for t in ask.threads:
            shallow, deep = (self._timed(self._stepper(m), t) for m in models)
            found[t] = max(0.0, (deep - shallow) / (NARROW_LAYERS[1] - NARROW_LAYERS[0]))
        return found

    def _narrow(self, ask: Ask, layers: int) -> Any:
        from transformers import CONFIG_MAPPING, AutoModelForCausalLM, LlamaConfig

        heads = max(1, int(ask.config.get("num_attention_heads") or 1))
        kv = max(1, int(ask.config.get("num_key_value_heads") or heads))
        narrow: dict[str, Any] = NARROW | {
            "num_key_value_heads": max(1, NARROW["num_attention_heads"] * kv // heads),
            "num_hidden_layers": layers,
        }
        given = {k: v for k, v in ask.config.items() if k not in ("layer_types", "architectures")}
        for key in given:
            if key.endswith("intermediate_size"):
                narrow[key] = 2 * NARROW["hidden_size"]
        narrow.setdefault("intermediate_size", 2 * NARROW["hidden_size"])
        kind = str(given.get("model_type") or ask.arch)
        try:
            config = CONFIG_MAPPING[kind](**(given | narrow))
            model = AutoModelForCausalLM.from_config(config, dtype=self._dtype)  # type: ignore[no-untyped-call]
        except (KeyError, ValueError, TypeError, AttributeError, IndexError):
            # an architecture unknown here, or one that refuses the narrow numbers: llama's
            config = LlamaConfig(**narrow)
            model = AutoModelForCausalLM.from_config(config, dtype=self._dtype)  # type: ignore[no-untyped-call]
        return model.eval()

    def _stepper(self, model: Any) -> Callable[[], None]:
        torch = self._torch
        from transformers import DynamicCache

        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.arange(16).unsqueeze(0), cache=cache, use_cache=True)
        token = torch.tensor([[1]])

        def step() -> None:
            with torch.inference_mode():
                model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
                cache.crop(-1)

        return step

    def _timed(self, kernel: Callable[[], None], threads: int) -> float:
        torch = self._torch
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return _best(kernel)
        finally:
            torch.set_num_threads(before)


def _best(kernel: Callable[[], None]) -> float:
    """The fastest run of `kernel` in about RUN_S, after one warm-up."""
    kernel()
    best, started = float("inf"), time.perf_counter()
    while True:
        began = time.perf_counter()
        kernel()
        best = min(best, time.perf_counter() - began)
        if time.perf_counter() - started >= RUN_S:
            return max(best, 1e-9)
