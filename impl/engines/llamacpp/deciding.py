"""Decisions on llama.cpp (LOC-DECIDE): chunked prefill, no decode, a saved prefix state.

The prefix state is `Llama.save_state()` taken right after the prefix's ids
and kept by the engine; a later prompt that starts with those ids restores
it with `load_state()` and prefills only the rest (LOC-DECIDE-06), whatever
chats ran on the context in between. Without a usable saved state the
context's own prefix reuse applies (the ids it holds). The prompt runs in
chunks so a cancel lands between two of them. The choices' first ids are
read from the last position's logits over the whole vocabulary.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from ..base import Decision
from .context import Context

CHUNK_TOKENS = 256
MIB = 1 << 20


@dataclass(slots=True)
class KeptPrefix:
    ids: tuple[int, ...]
    state: llama_cpp.LlamaState


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    values = logits.astype(np.float64)
    top = values.max()
    result: np.ndarray = values - top - math.log(float(np.exp(values - top).sum()))
    return result


def prefill_choices(
    context: Context,
    kept: KeptPrefix | None,
    prompt_ids: Sequence[int],
    prefix_length: int,
    *,
    choice_ids: Sequence[int],
    reuse: bool,
    cancel: threading.Event,
) -> tuple[Decision, KeptPrefix | None]:
    """The decision, and the prefix state to keep (the old one, a new one, or None)."""
    llama = context.llama
    ids = list(prompt_ids)
    with context.lock:
        context.unsteer()  # a decision is never steered (LOC-DECIDE)
        started = time.perf_counter()
        reused = _restore(context, kept, ids, reuse=reuse)
        restore_s = time.perf_counter() - started
        context.forget_owner()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        run = _prefill_chunks(
            llama, ids, reused, kept, prefix_length=prefix_length, reuse=reuse, cancel=cancel
        )
        prefill_s, prefill_cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        cancelled = run.position < len(ids)
        logps = () if cancelled else _choice_logps(llama, choice_ids)
    keep = run.saved if reuse else kept
    return (
        Decision(
            cancelled=cancelled,
            logps=logps,
            n_tokens=run.position,
            n_reused=reused,
            n_prefilled=run.position - reused,
            restore_s=restore_s,
            store_s=run.store_s,
            prefill_s=prefill_s,
            prefill_cpu_s=prefill_cpu_s,
            prefix_state_mib=(keep.state.llama_state_size / MIB) if keep is not None else 0.0,
        ),
        keep,
    )


def _restore(context: Context, kept: KeptPrefix | None, ids: list[int], *, reuse: bool) -> int:
    """Load `kept` when `ids` extend it, else reuse what the context holds; the ids reused."""
    usable = reuse and kept is not None and len(kept.ids) < len(ids)
    if usable and kept is not None and tuple(ids[: len(kept.ids)]) == kept.ids:
        context.llama.load_state(kept.state)
        return len(kept.ids)
    return context.reuse_prefix(ids)


@dataclass(frozen=True, slots=True)
class _PrefillRun:
    """Where a chunked prefill stopped, the prefix state it ends with, its time saving it."""

    position: int
    saved: KeptPrefix | None
    store_s: float


def _prefill_chunks(
    llama: llama_cpp.Llama,
    ids: list[int],
    start: int,
    kept: KeptPrefix | None,
    *,
    prefix_length: int,
    reuse: bool,
    cancel: threading.Event,
) -> _PrefillRun:
    """Evaluate `ids` from `start` in chunks until done or cancelled, saving the prefix's state."""
    store_s, position = 0.0, start
    saved = kept
    while position < len(ids) and not cancel.is_set():
        end = min(len(ids), position + CHUNK_TOKENS)
        if reuse and position < prefix_length < end:
            end = prefix_length  # stop at the prefix's end to save its state
        llama.eval(ids[position:end])
        position = end
        if reuse and position == prefix_length and prefix_length > start:
            store0 = time.perf_counter()
            saved = KeptPrefix(tuple(ids[:prefix_length]), llama.save_state())
            store_s += time.perf_counter() - store0
    return _PrefillRun(position=position, saved=saved, store_s=store_s)


def _choice_logps(llama: llama_cpp.Llama, choice_ids: Sequence[int]) -> tuple[float | None, ...]:
    """The last position's log-probability of each choice id (None where it is infinite)."""
    # llama-cpp-python keeps no logits rows without logits_all: read the context's.
    vocab = int(llama.n_vocab())
    logits = llama._ctx.get_logits()  # type: ignore[no-untyped-call]
    table = _log_softmax(np.ctypeslib.as_array(logits, shape=(vocab,)))
    return tuple(None if math.isinf(table[i]) else float(table[i]) for i in choice_ids)
