"""A llama.cpp context's sequences saved to the prompt cache and restored from it.

`save` copies a sequence's KV (`llama_state_seq_get_data`: its cells, their
positions and every layer's keys and values) into a buffer the prompt cache
keeps (engines/prompt_cache.py); `restore` puts the best entry back into a
sequence (`llama_state_seq_set_data`) and drops what lies past the prefix the
new prompt shares with it. The serial context (one sequence) and the batch's
(one KV stream per row) save into the engine's one cache, each under a key of
its own: a sequence's state records how many streams its context has, and
llama.cpp restores it only into a context with as many (any sequence of it).
The key also holds the steering state the KV was computed under (steering.py),
so a steered prompt never restores unsteered KV, nor the other way; KV that
mixes two states (`MIXED`) is never saved.

A sequence is saved when what it holds is about to be lost: its tail dropped
for a prompt that shares less of it, or its KV overwritten by another."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Hashable, Sequence
from typing import Any

import llama_cpp

from ..prompt_cache import MIB, PromptCache
from .steering import MIXED

log = logging.getLogger(__name__)


class States:
    """Saves and restores the sequences of one llama.cpp context (`ctx`, with `streams` KV
    streams: 1 for the serial context, one per row for the batch's)."""

    def __init__(self, ctx: Any, cache: PromptCache, streams: int) -> None:
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._streams = streams
        self.cache = cache

    def save(self, seq: int, ids: Sequence[int], steering: Hashable = ()) -> None:
        """Keep sequence `seq`'s KV, which holds `ids` computed under the `steering` state,
        unless the cache has it already."""
        key = (self._streams, steering)
        if steering is MIXED or not self.cache.worth(ids, key):
            return
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, seq))
        if size <= 0 or size > self.cache.budget:
            return
        buffer = (ctypes.c_ubyte * size)()
        written = int(llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq))
        if written <= 0:
            log.warning("saving sequence %d's state failed: not cached", seq)
            return
        self.cache.put(list(ids), key, buffer, written)
        log.debug("prompt cache: saved %d tokens (%.1f MiB)", len(ids), written / MIB)

    def restore(
        self,
        seq: int,
        ids: Sequence[int],
        kept: int,
        held: Sequence[int],
        steering: Hashable = (),
        held_steering: Hashable = (),
    ) -> list[int] | None:
        """Put into sequence `seq` the cached state computed under `steering` sharing the
        longest prefix with `ids`, when it shares more than the `kept` ids the sequence would
        keep of what it holds (`held`, computed under `held_steering`, saved first when the
        cache lacks it); the ids the sequence holds then (cut to the shared prefix), or None
        (nothing better cached: the sequence is as it was)."""
        if not self.cache.enabled or steering is MIXED:
            return None
        found = self.cache.best(ids, (self._streams, steering), at_least=kept)
        if found is None:
            return None
        self.save(seq, held, held_steering)
        entry = found.entry
        llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
        read = int(llama_cpp.llama_state_seq_set_data(self._ctx, entry.state, entry.size, seq))
        if read <= 0:  # the sequence is empty now: the caller prefills it all
            log.warning("restoring a cached state into sequence %d failed", seq)
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            return []
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, found.shared, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            return []
        cache = self.cache
        log.info(
            "prompt cache: restored %d of %d prompt tokens (%d states, %.1f MiB held)",
            found.shared,
            len(ids),
            len(cache),
            cache.held_bytes / MIB,
        )
        return [int(i) for i in entry.ids[: found.shared]]
