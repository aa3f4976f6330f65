"""A model's shape as the planner prices it, read without loading it (REQ-003 PLAN-04).

A GGUF file gives its header (engines/gguf.py; the tensor sums of
models/inspection.py, shared with POST /api/hf/inspect): layers, width,
heads, the trained window, and every tensor's size, so the bytes a token
touches are the dense tensors plus the experts a token uses. An HF folder
gives its `config.json` and weight files. On llama.cpp the weights are held as
stored and the KV cache is f16; on transformers the weights and the KV cache
are held in the compute type (a GGUF is converted to float32 first).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines import gguf
from ..engines.base import EngineId
from ..models.inspection import header_facts, meta_int
from .kernels import Ask, Matrix

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_BYTES_LLAMACPP = 2  # llama.cpp's default cache type, f16


class ShapeError(ValueError):
    """The model's shape could not be read (the message says why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    engine: EngineId
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_ctx_train: int
    vocab: int
    params: int  # parameter count (every tensor's elements)
    stored_bytes: int  # the weights on disk
    stored_dtype: str  # "gguf" for a GGUF file, else the folder's torch_dtype
    active_fraction: float  # of the weights a token touches (1.0 unless a MoE)
    layer: tuple[Matrix, ...]  # a layer's weight matrices a token multiplies: rows, width, type
    head: Matrix | None  # the output matrix (the embeddings when tied)
    config: dict[str, Any]  # an HF folder's text config; the header's words for a GGUF

    def ask(self, threads: tuple[int, ...], dtype: str) -> Ask:
        """The kernel probe's question for this model on `threads`."""
        return Ask(
            engine="llama.cpp" if self.engine == EngineId.LLAMACPP else "transformers",
            threads=threads,
            layer=self.layer,
            head=self.head,
            n_layer=self.n_layer,
            width=self.n_embd,
            dtype=self.compute_dtype(dtype),
            arch=self.arch,
            config=self.config,
        )

    def weight_bytes(self, dtype: str) -> int:
        """The weights as held in memory: as stored on llama.cpp; in the compute type on
        transformers (`auto`: as stored, a GGUF's conversion being float32)."""
        if self.engine == EngineId.LLAMACPP:
            return self.stored_bytes
        held = self.compute_dtype(dtype)
        if held == self.stored_dtype:
            return self.stored_bytes
        return self.params * DTYPE_BYTES[held]

    def compute_dtype(self, dtype: str) -> str:
        """The type transformers computes in: `dtype`; `auto` is float32, as the engine
        loads on the CPU (on a GPU the plan names a half type: rules.py)."""
        return dtype if dtype in DTYPE_BYTES else "float32"

    def token_bytes(self, dtype: str) -> int:
        """The weight bytes one decoded token reads."""
        return int(self.weight_bytes(dtype) * self.active_fraction)

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Keys and values of one token, every layer."""
        if self.engine == EngineId.LLAMACPP:
            size = KV_BYTES_LLAMACPP
        else:
            size = DTYPE_BYTES[self.compute_dtype(dtype)]
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * size


def read(path: Path, engine: EngineId) -> Shape:
    """The shape of the model at `path` as `engine` would hold it; ShapeError otherwise."""
    if path.is_file():
        return _gguf(path, engine)
    if (path / "config.json").is_file():
        return _folder(path, engine)
    raise ShapeError(f"{path} is neither a GGUF file nor a folder with config.json")


def _gguf(path: Path, engine: EngineId) -> Shape:
    try:
        with path.open("rb") as handle:
            meta, tensors = gguf.read_header(handle)
    except (OSError, gguf.NotGGUF) as exc:
        raise ShapeError(f"{path.name}: {exc}") from exc
    facts = header_facts(meta, tensors)
    arch = facts["arch"]
    heads = meta_int(meta, f"{arch}.attention.head_count") or 1
    kv_heads = meta_int(meta, f"{arch}.attention.head_count_kv") or heads
    width = facts["n_embd"]
    whole = facts["dense_bytes"] + facts["expert_bytes"]
    named = {t.name: t for t in tensors}
    head = named.get("output.weight") or named.get("token_embd.weight")
    return Shape(
        engine=engine,
        arch=arch,
        n_layer=facts["n_layer"],
        n_embd=width,
        n_head=heads,
        n_kv_head=kv_heads,
        head_dim=meta_int(meta, f"{arch}.attention.key_length") or width // heads,
        n_ctx_train=meta_int(meta, f"{arch}.context_length"),
        vocab=next(
            (math.prod(t.shape) // max(width, 1) for t in tensors if t.name == "token_embd.weight"),
            0,
        ),
        params=sum(math.prod(t.shape) for t in tensors),
        stored_bytes=path.stat().st_size,
        stored_dtype="gguf",
        active_fraction=facts["token_cycle_bytes"] / whole if whole else 1.0,
        layer=_gguf_layer(tensors, facts),
        head=None if head is None else (head.shape[1], head.shape[0], head.kind),
        config={"model_type": arch, "num_attention_heads": heads, "num_key_value_heads": kv_heads},
    )


def _gguf_layer(tensors: list[gguf.TensorInfo], facts: dict[str, Any]) -> tuple[Matrix, ...]:
    """The middle block's matrices (past any leading dense blocks of a MoE): each 2-D
    weight, and of each expert tensor the rows of the experts a token uses."""
    block = f"blk.{facts['n_layer'] // 2}."
    found: list[Matrix] = []
    for t in tensors:
        if not t.name.startswith(block) or len(t.shape) < 2:
            continue
        rows = t.shape[1] * (max(1, facts["n_expert_used"]) if len(t.shape) == 3 else 1)
        found.append((rows, t.shape[0], t.kind))
    return tuple(found)


def _folder(path: Path, engine: EngineId) -> Shape:
    try:
        config = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ShapeError(f"{path.name}/config.json: {exc}") from exc
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = meta_int(text, "num_attention_heads") or 1
    width = meta_int(text, "hidden_size")
    stored = sum(p.stat().st_size for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "float32")
    size = DTYPE_BYTES.get(dtype, 4)
    experts = meta_int(text, "num_experts") or meta_int(text, "num_local_experts")
    used = meta_int(text, "num_experts_per_tok")
    kv_heads = meta_int(text, "num_key_value_heads") or heads
    head_dim = meta_int(text, "head_dim") or width // heads
    ffn = (meta_int(text, "moe_intermediate_size") * used if experts and used else 0) or (
        meta_int(text, "intermediate_size") or 4 * width
    )
    layer = (
        (heads * head_dim, width, 0),
        (kv_heads * head_dim, width, 0),
        (kv_heads * head_dim, width, 0),
        (width, heads * head_dim, 0),
        (ffn, width, 0),
        (ffn, width, 0),
        (width, ffn, 0),
    )
    return Shape(
        engine=engine,
        arch=str(text.get("model_type", "")),
        n_layer=meta_int(text, "num_hidden_layers"),
        n_embd=width,
        n_head=heads,
        n_kv_head=kv_heads,
        head_dim=head_dim,
        n_ctx_train=meta_int(text, "max_position_embeddings"),
        vocab=meta_int(text, "vocab_size"),
        params=stored // size,
        stored_bytes=stored,
        stored_dtype=dtype if dtype in DTYPE_BYTES else "float32",
        active_fraction=min(1.0, used / experts) if experts and used else 1.0,
        layer=layer,
        head=(meta_int(text, "vocab_size"), width, 0),
        config=text,
    )
