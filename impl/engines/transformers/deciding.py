"""Decisions (LOC-DECIDE): one chunked prefill, no decode, a kept prefix state.

The engine keeps a second KV cache for decisions (not the generation one, so
chats in between do not evict it), holding exactly the prompt's prefix: after
a decision it is cropped back to the prefix length. A decision with
`reuse_prefix: false` prefills in full on a cache of its own and leaves the
kept one alone. A later prompt that
starts with those ids restores it and prefills only the rest (LOC-DECIDE-06).
The prompt runs in chunks so that a cancel lands between two of them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from ..base import Decision
from .prefix import Held, PrefixCache

CHUNK_TOKENS = 256
MIB = 1 << 20


def _state_mib(cache: DynamicCache) -> float:
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total / MIB


def prefill_choices(
    model: PreTrainedModel,
    kept: PrefixCache,
    prompt_ids: Sequence[int],
    prefix_length: int,
    *,
    choice_ids: Sequence[int],
    reuse: bool,
    cancel: threading.Event,
    keeps_last: bool = True,
) -> Decision:
    """Prefill `prompt_ids` (less the kept prefix) in chunks; score the choices' first ids."""
    extra = {"logits_to_keep": 1} if keeps_last else {}
    started = time.perf_counter()
    held, reused = kept.take(prompt_ids, reuse=True) if reuse else (kept.fresh(), 0)
    restore_s = time.perf_counter() - started
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        logits, unfed = _prefill_chunks(model, held, prompt_ids[reused:], extra, cancel=cancel)
        prefill_s, prefill_cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        store0 = time.perf_counter()
        state_mib = _keep(kept, held, prefix_length) if reuse else 0.0
        store_s = time.perf_counter() - store0
    except BaseException:
        if reuse:
            held.torn = True
            kept.give_back(held)
        raise
    cancelled = logits is None or unfed > 0
    logps: tuple[float | None, ...] = ()
    if not cancelled and logits is not None:
        logps = _choice_logps(logits, choice_ids)
    n_prefilled = len(prompt_ids) - reused - unfed
    return Decision(
        cancelled=cancelled,
        logps=logps,
        n_tokens=reused + n_prefilled,
        n_reused=reused,
        n_prefilled=n_prefilled,
        restore_s=restore_s,
        store_s=store_s,
        prefill_s=prefill_s,
        prefill_cpu_s=prefill_cpu_s,
        prefix_state_mib=state_mib,
    )


def _prefill_chunks(
    model: PreTrainedModel,
    held: Held,
    ids: Sequence[int],
    extra: dict[str, Any],
    *,
    cancel: threading.Event,
) -> tuple[torch.Tensor | None, int]:
    """Feed `ids` in chunks until done or cancelled: the last logits, and how many stay unfed."""
    rest = list(ids)
    logits: torch.Tensor | None = None
    while rest:
        if cancel.is_set():
            break
        chunk, rest = rest[:CHUNK_TOKENS], rest[CHUNK_TOKENS:]
        with torch.inference_mode():
            logits = held.feed(model, chunk, extra)
    return logits, len(rest)


def _choice_logps(logits: torch.Tensor, choice_ids: Sequence[int]) -> tuple[float | None, ...]:
    """Each choice id's log-probability under `logits` (None where it is minus infinity)."""
    table = torch.log_softmax(logits.double(), dim=-1)
    return tuple(_finite(float(v)) for v in table[list(choice_ids)].tolist())  # one copy


def _keep(kept: PrefixCache, held: Held, length: int) -> float:
    """Keep `held` cropped to its first `length` tokens (nothing when 0); the kept MiB."""
    if length <= 0 or len(held.ids) < length:
        held.torn = True
        kept.give_back(held)
        return 0.0
    if len(held.ids) > length:
        with torch.inference_mode():
            held.cache.crop(length - len(held.ids))  # a negative count removes tokens
        del held.ids[length:]
    kept.give_back(held)
    return _state_mib(held.cache)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) and value < 0 else value
