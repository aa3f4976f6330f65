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
- Entries are found through an index of their prefixes at block boundaries
  (BLOCK ids, a chained hash per block, under their key), so a lookup costs
  the prompt's length and a few exact comparisons, however many entries the
  budget holds (thousands, for short chats in gigabytes): a linear scan cost
  about 2.5 ms a thousand entries a lookup on the engine's thread, and a busy
  server slowed by a third within a few thousand requests (docs/DECISIONS.md,
  "The prompt cache's index"). A shared prefix shorter than a block (a prompt's first BLOCK
  ids) is not looked for; among the entries sharing the deepest block, the
  CANDIDATES most recently used are compared exactly.

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
BLOCK = 16  # ids a step of the prefix index
CANDIDATES = 32  # entries compared exactly at the deepest block a lookup shares
DEFAULT_MIB = 8192  # `cache_ram` auto, at most (llama-server's --cache-ram default)


@dataclass(eq=False, slots=True)
class Entry:
    """One kept state: the ids its KV holds, the state, its size, and its prefixes' hashes
    at each block boundary (the index's keys)."""

    ids: npt.NDArray[np.int64]
    key: Hashable
    state: Any
    size: int
    blocks: list[int] = field(default_factory=list)


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


Bucket = OrderedDict[int, None]  # entry handles, least recently used first


@dataclass(eq=False)
class PromptCache:
    """Prompt states up to `budget` bytes, least recently used evicted first."""

    budget: int
    _entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    _bytes: int = 0
    counts: Counts = field(default_factory=Counts)
    # (key, a block prefix's hash) -> the entries holding that prefix; and the entries whose
    # last whole block it is (those a longer prompt of theirs covers)
    _holding: dict[tuple[Hashable, int], Bucket] = field(default_factory=dict)
    _ending: dict[tuple[Hashable, int], Bucket] = field(default_factory=dict)

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
        wanted = np.asarray(ids[:-1], dtype=np.int64)
        found: Found | None = None
        for entry in self._deepest(wanted, key):
            shared = _shared(entry.ids, wanted)
            if shared > at_least and (found is None or shared > found.shared):
                found = Found(entry, shared)
        if found is None:
            self.counts.misses += 1
            return None
        self._used(id(found.entry))
        self.counts.hits += 1
        self.counts.tokens_restored += found.shared - at_least
        return found

    def covers(self, ids: Sequence[int], key: Hashable) -> bool:
        """Whether an entry of `key` already holds all of `ids` (saving them adds nothing)."""
        wanted = np.asarray(ids, dtype=np.int64)
        return any(
            len(entry.ids) >= len(wanted) and _shared(entry.ids, wanted) == len(wanted)
            for entry in self._deepest(wanted, key)
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
        blocks = block_hashes(kept)
        for handle in self._ended_within(blocks, key):
            if _shared(kept, self._entries[handle].ids) == len(self._entries[handle].ids):
                self._drop(handle)
        entry = Entry(kept, key, state, size, blocks)
        handle = id(entry)
        self._entries[handle] = entry
        for block in blocks:
            self._holding.setdefault((key, block), OrderedDict())[handle] = None
        if blocks:
            self._ending.setdefault((key, blocks[-1]), OrderedDict())[handle] = None
        self._bytes += size
        self.counts.saved += 1
        while self._bytes > self.budget:
            self._drop(next(iter(self._entries)))
            self.counts.evicted += 1

    def clear(self) -> None:
        self._entries.clear()
        self._holding.clear()
        self._ending.clear()
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

    def _deepest(self, wanted: npt.NDArray[np.int64], key: Hashable) -> list[Entry]:
        """The entries of `key` sharing the deepest whole block of `wanted`: the most
        recently used CANDIDATES of them (none when not even its first block is held)."""
        for block in reversed(block_hashes(wanted)):
            bucket = self._holding.get((key, block))
            if bucket:
                recent = list(reversed(bucket))[:CANDIDATES]
                return [self._entries[handle] for handle in recent]
        return []

    def _ended_within(self, blocks: list[int], key: Hashable) -> list[int]:
        """The entries of `key` whose last whole block is one of `blocks` (those a prompt
        with these blocks may cover)."""
        return [h for block in blocks for h in self._ending.get((key, block), ())]

    def _used(self, handle: int) -> None:
        self._entries.move_to_end(handle)
        entry = self._entries[handle]
        for block in entry.blocks:
            self._holding[(entry.key, block)].move_to_end(handle)

    def _drop(self, handle: int) -> None:
        entry = self._entries.pop(handle)
        self._bytes -= entry.size
        for index, blocks in ((self._holding, entry.blocks), (self._ending, entry.blocks[-1:])):
            for block in blocks:
                bucket = index[(entry.key, block)]
                bucket.pop(handle, None)
                if not bucket:
                    del index[(entry.key, block)]


def block_hashes(ids: npt.NDArray[np.int64]) -> list[int]:
    """The hash of each whole-block prefix of `ids` (`ids[:BLOCK]`, `ids[:2 * BLOCK]`, ...),
    each chained from the one before: the prompt's length in work."""
    hashes: list[int] = []
    running = 0
    for start in range(0, len(ids) - BLOCK + 1, BLOCK):
        running = hash((running, ids[start : start + BLOCK].tobytes()))
        hashes.append(running)
    return hashes


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
