"""Embeddings on llama.cpp: mean pooling, the context switched to embeddings per request.

GGUF models are loaded with mean pooling (OAI-EMB-28); the context runs with
embeddings off for generation and is switched on (`llama_set_embeddings`)
only while a request embeds. Each input runs as sequence 0 of its own batch
on a cleared cache, so the cache the generation path kept is dropped: the
next chat turn prefills in full. An input must fit one batch (the limit is
the smaller of the context window and the batch size, OAI-EMB-19).
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np

from .context import Context


def limit(context: Context) -> int:
    llama = context.llama
    return min(int(llama.n_ctx()), int(llama.n_batch))


def embed(context: Context, inputs: Sequence[Sequence[int]]) -> np.ndarray:
    """Mean-pooled last-layer vectors [len(inputs), n_embd], float32."""
    llama = context.llama
    width = int(llama.n_embd())
    out = np.empty((len(inputs), width), dtype=np.float32)
    with context.lock:
        context.unsteer()  # an embedding is never steered
        ctx = llama._ctx
        llama_cpp.llama_set_embeddings(ctx.ctx, True)
        try:
            for row, ids in enumerate(inputs):
                llama._batch.reset()  # type: ignore[no-untyped-call]
                llama._batch.add_sequence(list(ids), 0, True)
                ctx.kv_cache_clear()  # type: ignore[no-untyped-call]
                ctx.decode(llama._batch)
                pointer = llama_cpp.llama_get_embeddings_seq(ctx.ctx, 0)
                out[row] = np.ctypeslib.as_array(pointer, shape=(width,))
        finally:
            llama._batch.reset()  # type: ignore[no-untyped-call]
            llama_cpp.llama_set_embeddings(ctx.ctx, False)
            ctx.kv_cache_clear()  # type: ignore[no-untyped-call]
            llama.n_tokens = 0
            context.forget_owner()
    return out
