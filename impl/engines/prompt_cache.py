"""The prompt cache: KV states of earlier prompts kept in host memory, up to a budget.

A request whose prompt begins like one seen before gets that prefix's KV
restored instead of prefilled (issue 43), as llama.cpp's server restores its
host-memory prompt cache. Each engine saves and restores its own states
(llama.cpp: a sequence's state, `llama_state_seq_get_data`; transformers: the
cache's tensors); this store only keeps them, finds the best one and evicts.

- An entry is the ids its KV holds, the state itself and its size in bytes,
  under a `key`: what else the KV depends on besides the ids (the steering
  that ran on them; the model and engine are the store's own, one per loaded
  engine). A lookup only sees entries of the same key, so a steered row
  never reuses unsteered KV, nor the other way.
- `best(ids, key)` is the entry sharing the longest prefix with `ids` (at
  most all but the last id, which is always run so its logits are fresh).
  One entry serves every prompt that shares any prefix with it: the engine
  restores it and drops what lies past the shared part.
- `put` keeps an entry, evicting the least recently used ones past the
  budget; an entry that another of its key already covers (its ids are a
  prefix of the other's) is not kept, and one it covers is dropped.
- Hits, misses, the tokens restored and the bytes held are counted for
  `/api/health/inference` and the log.

The engine's one worker thread calls it; `stats` may be read from any.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

MIB = 1 << 20
MIN_TOKENS = 16  # a shorter prompt is not worth a state of its own
DEFAULT_MIB = 8192  # `cache_ram` auto, at most (llama-server's --cache-ram default)


@dataclass(eq=False, slots=True)
class Entry:
    """One kept state: the ids its KV holds, the state, its size."""

    ids: npt.NDArray[np.int64]
    key: Hashable
    state: Any
    size: int


@dataclass(frozen=True, slots=True)
class Found:
    """A lookup's answer: the entry and how many of the prompt's ids it holds."""

    entry: Entry
    shared: int


@dataclass(slots=True)
class Counts:
    hits: int = 0
    misses: int = 0
    tokens_restored: int = 0
    saved: int = 0
    evicted: int = 0


@dataclass(eq=False)
class PromptCache:
    """Prompt states up to `budget` bytes, least recently used evicted first."""

    budget: int
    _entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    _bytes: int = 0
    counts: Counts = field(default_factory=Counts)

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, ids: Sequence[int], key: Hashable, at_least: int = 0) -> Found | None:
        """The entry of `key` sharing the longest prefix with `ids` (at most all but the
        last), when it shares more than `at_least` (what the engine holds already); counted
        as a hit, else as a miss."""
        if not self._entries or len(ids) < 2:
            self.counts.misses += 1
            return None
        wanted = np.asarray(ids[:-1], dtype=np.int64)
        found: Found | None = None
        for entry in self._entries.values():
            if entry.key != key or entry.ids[0] != wanted[0]:
                continue
            shared = _shared(entry.ids, wanted)
            if shared > at_least and (found is None or shared > found.shared):
                found = Found(entry, shared)
        if found is None:
            self.counts.misses += 1
            return None
        self._entries.move_to_end(id(found.entry))
        self.counts.hits += 1
        self.counts.tokens_restored += found.shared - at_least
        return found

    def covers(self, ids: Sequence[int], key: Hashable) -> bool:
        """Whether an entry of `key` already holds all of `ids` (saving them adds nothing)."""
        wanted = np.asarray(ids, dtype=np.int64)
        return any(
            entry.key == key
            and len(entry.ids) >= len(wanted)
            and _shared(entry.ids, wanted) == len(wanted)
            for entry in self._entries.values()
        )

    def worth(self, ids: Sequence[int], key: Hashable) -> bool:
        """Whether saving `ids`' state would keep something new."""
        return self.enabled and len(ids) >= MIN_TOKENS and not self.covers(ids, key)

    def put(self, ids: Sequence[int], key: Hashable, state: Any, size: int) -> None:
        """Keep `state` (the KV of `ids` under `key`, `size` bytes); the entries it covers
        go, then the least recently used ones until the budget holds."""
        if size > self.budget or not self.worth(ids, key):
            return
        kept = np.asarray(ids, dtype=np.int64)
        for handle, entry in list(self._entries.items()):
            if entry.key == key and _shared(kept, entry.ids) == len(entry.ids):
                self._drop(handle)
        entry = Entry(kept, key, state, size)
        self._entries[id(entry)] = entry
        self._bytes += size
        self.counts.saved += 1
        while self._bytes > self.budget:
            self._drop(next(iter(self._entries)))
            self.counts.evicted += 1

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def stats(self) -> dict[str, int]:
        """What `/api/health/inference` shows of the cache."""
        c = self.counts
        return {
            "entries": len(self._entries),
            "bytes": self._bytes,
            "budget_bytes": self.budget,
            "hits": c.hits,
            "misses": c.misses,
            "tokens_restored": c.tokens_restored,
            "evicted": c.evicted,
        }

    def _drop(self, handle: int) -> None:
        entry = self._entries.pop(handle)
        self._bytes -= entry.size


def _shared(held: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]) -> int:
    """How many leading ids `held` and `ids` share."""
    n = min(len(held), len(ids))
    differ = np.flatnonzero(held[:n] != ids[:n])
    return int(differ[0]) if differ.size else n


def prompt_cache(mib: int) -> PromptCache | None:
    """The cache a load keeps: `mib` MiB (-1: DEFAULT_MIB, the model manager having cut
    auto to the memory there is), None for 0 (off)."""
    if mib == 0:
        return None
    return PromptCache((DEFAULT_MIB if mib < 0 else mib) * MIB)
