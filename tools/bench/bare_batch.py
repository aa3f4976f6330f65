"""The bare engine batched: llama.cpp's batch API driven directly, no miserver code.

`bare_engine` loads the model with a second context of `rows` sequences
(each its own KV stream, a share of the window, `kv_unified` off, as `serve
--parallel` makes it); `bare_rows` prefills k prompts on sequences 0..k-1 and
takes greedy steps of all rows, one `llama_decode` each, ignoring EOS. The
greedy pick is an argmax over the logits row where llama.cpp left it (`Greedy`):
llama.cpp's greedy sampler picks the same token but copies the row first.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _internals

from miserver.engines.cores import usable_cores
from tools.bench import common

BATCH = 512  # tokens a bare batch holds
Run = common.Run


@dataclass(frozen=True, slots=True, kw_only=True)
class Batched(Run):
    """Rows at once: `tokens` / `seconds` is the aggregate, `rows` each row's own run. Its own
    fields are keywords only: Run's may grow (it did: `ttft`), and a positional `prefill`
    would land in the new field."""

    prefill: float = 0.0  # seconds before the first step (bare only)
    rows: tuple[Run, ...] = ()


@dataclass(slots=True)
class Bare:
    """A context of many sequences over a loaded model and a batch."""

    llama: llama_cpp.Llama
    context: _internals.LlamaContext
    batch: llama_cpp.llama_batch
    greedy: Greedy


@contextlib.contextmanager
def bare_engine(path: Path, window: int, threads: int | None, rows: int) -> Iterator[Bare]:
    llama = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=window,
        n_threads=threads or usable_cores(),
        n_threads_batch=threads or usable_cores(),
        flash_attn=True,  # as miserver's engine loads it
        verbose=False,
    )
    params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
    params.n_seq_max = rows
    params.n_ctx = window  # split among the rows, as `serve --parallel` splits it
    params.kv_unified = False
    context = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
    batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
    bare = Bare(llama, context, batch, Greedy(context.ctx, llama.n_vocab()))
    try:
        yield bare
    finally:
        llama_cpp.llama_batch_free(bare.batch)
        context.close()  # type: ignore[no-untyped-call]
        llama.close()


def put(batch: llama_cpp.llama_batch, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    """Token `i` of `batch`: `token` at `pos` of sequence `seq`, its logits kept if `logits`."""
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits


def _decode(bare: Bare, n_tokens: int) -> None:
    bare.batch.n_tokens = n_tokens
    status = llama_cpp.llama_decode(bare.context.ctx, bare.batch)
    if status != 0:
        raise RuntimeError(f"llama_decode failed ({status})")


class Greedy:
    """The first of the highest logits of a batch row, read in place. A row's numpy view is
    made once per address (making one costs more than the argmax)."""

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int) -> None:
        self.ctx = ctx
        self._row_type = ctypes.c_float * n_vocab
        self._views: dict[int, np.ndarray] = {}

    def __call__(self, index: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        address = ctypes.cast(pointer, ctypes.c_void_p).value or 0
        view = self._views.get(address)
        if view is None:
            view = np.frombuffer(memoryview(self._row_type.from_address(address)), np.float32)
            self._views[address] = view
        return int(view.argmax())


def _pick(bare: Bare, index: int) -> int:
    return bare.greedy(index)


def _prefill(bare: Bare, seq: int, ids: Sequence[int]) -> int:
    """Run `ids` on sequence `seq`, in chunks of BATCH; the token picked after them."""
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        for j, token in enumerate(chunk):
            put(bare.batch, j, token, start + j, seq, start + j == len(ids) - 1)
        _decode(bare, len(chunk))
    return _pick(bare, (len(ids) - 1) % BATCH)


def bare_rows(bare: Bare, prompts: Sequence[Sequence[int]], tokens: int) -> Batched:
    """Prefill each prompt on its own sequence, then `tokens` greedy steps of all rows."""
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(bare.context.ctx), True)
    started = time.perf_counter()
    made = [[_prefill(bare, seq, ids)] for seq, ids in enumerate(prompts)]
    prefilled = time.perf_counter()
    for step in range(tokens):
        for seq, ids in enumerate(prompts):
            put(bare.batch, seq, made[seq][-1], len(ids) + step, seq, True)
        _decode(bare, len(prompts))
        for seq, row in enumerate(made):
            row.append(_pick(bare, seq))
    seconds = time.perf_counter() - prefilled
    texts = [bare.llama.detokenize(row[1:]).decode("utf-8", "replace") for row in made]
    rows = tuple(Run(tokens, seconds, text) for text in texts)
    return Batched(tokens * len(rows), seconds, texts[0], prefill=prefilled - started, rows=rows)
