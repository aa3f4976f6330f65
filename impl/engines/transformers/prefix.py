"""The one KV cache the engine keeps between generations (LOC-CHAT-43).

The server keeps no conversation, so a chat's next turn resends the whole
history. The engine keeps the `DynamicCache` of its last generation with the
exact token ids whose keys and values it holds: the prompt, then every
generated token that was fed back (the last sampled token never is). A new
prompt reuses the longest prefix it shares with those ids, at most all but
its last token (one token must run to give logits); the cache is cropped to
that length and only the rest is prefilled. A different conversation shares
only the template's opening and so prefills (nearly) in full; two taking
turns evict each other, as there is one cache.

Handoff: `take` removes the kept cache, the generation feeds it, and
`give_back` keeps it again when the generation ends, however it ends (EOS,
`max_tokens`, the consumer closing the stream, an error between passes).
A pass that raised may have written some layers and not others: that cache
is torn and dropped, so the next prompt prefills in full.

The prompt cache (engines/prompt_cache.py, issue 43): when the engine has
one (`store`), a kept cache about to be lost goes there first (whole when a
new prompt shares nothing of it; a copy when it is cut back for one that
shares part), and a prompt that shares more with a stored cache than with the
kept one starts from a copy of that one's shared prefix (`restored`): the
entry stays for the next prompt, so rows that join together with one system
prompt each get it. The batch's rows (batch.py) keep what they leave there too:
a `Held` is a batch of one either way, so the serial path and the rows restore
each other's. Entries are keyed by the steering state their keys and values
were made under (`Held.key`). They are kept in host memory (`stored`): a model on
a GPU copies a cache out as it goes to the store and back as it is restored.

Seeds: a seeded request (OAI-SEED-05: same seed, body and model give
byte-identical text) never reuses. A prefill split into a cached part and a
rest may differ from a full prefill in the last float bits, which can flip a
sampled token; so a seeded request prefills in full, reports no cached
tokens, and its cache is still kept for later unseeded requests.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ..prompt_cache import PromptCache


@dataclass(slots=True)
class Held:
    """A KV cache and the token ids whose keys and values it holds, in order."""

    cache: DynamicCache
    ids: list[int] = field(default_factory=list)
    torn: bool = False
    key: Hashable = ()

    def feed(self, model: PreTrainedModel, ids: list[int], extra: dict[str, Any]) -> torch.Tensor:
        """Run `ids` through `model` after the cached ones; the logits of the last position."""
        return self.feed_all(model, ids, extra)[-1]

    def feed_all(
        self, model: PreTrainedModel, ids: list[int], extra: dict[str, Any] | None = None
    ) -> torch.Tensor:
        """Run `ids` through `model` after the cached ones; the logits the model kept ([kept,
        vocab]: every position's unless `extra` holds `logits_to_keep`).

        If the pass raises, the cache stays marked torn and is never reused.
        """
        self.torn = True
        out = model(
            input_ids=torch.tensor([ids], dtype=torch.long, device=model.device),
            use_cache=True,
            **kv_cache(model, self.cache),
            **(extra or {}),
        )
        self.ids.extend(ids)
        self.torn = False
        logits: torch.Tensor = out.logits[0]
        return logits


class PrefixCache:
    """The engine's single kept KV cache, handed to one generation at a time; with a
    `store`, the prompt cache behind it."""

    def __init__(
        self,
        config: PreTrainedConfig,
        store: PromptCache | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._config = config
        self._device = device or torch.device("cpu")  # the model's: where restored ones go
        usable = store is not None and store.enabled and batchable(config)
        self._store = store if usable else None
        self._lock = threading.Lock()
        self._kept: Held | None = None
        self._closed = False

    def take(
        self, prompt_ids: Sequence[int], *, reuse: bool, key: Hashable = ()
    ) -> tuple[Held, int]:
        """A cache holding the longest usable prefix of `prompt_ids`, and its length.

        Without `reuse`, when nothing is shared, or when the kept cache was filled
        under another `key` (a different steering state: other K/V), the cache is
        a fresh one, unless the prompt cache holds a prefix (a copy of it, then).
        """
        with self._lock:
            kept, self._kept = self._kept, None
        length = 0
        if kept is not None and reuse and kept.key == key:
            length = usable_prefix(kept.ids, prompt_ids)
        found = None
        if self._store is not None and reuse:
            found = restored(self._store, prompt_ids, key, self._config, self._device, length)
        if found is None and kept is not None and length:
            self._save_copy(kept, length)
            if crop(kept, length):
                return kept, length
        if kept is not None and self._store is not None:  # replaced: stored whole, not copied
            stored(self._store, kept, self._config)
        if found is not None:
            return found, len(found.ids)
        return Held(DynamicCache(config=self._config), key=key), 0

    def _save_copy(self, kept: Held, length: int) -> None:
        """A copy of `kept` to the store, when cutting it to `length` drops what it lacks."""
        store = self._store
        if store is not None and length < len(kept.ids) and store.worth(kept.ids, kept.key):
            stored(store, kept, self._config, copy=True)

    def fresh(self) -> Held:
        """An empty cache, leaving the kept one where it is."""
        return Held(DynamicCache(config=self._config))

    def give_back(self, held: Held) -> None:
        """Keep `held` for the next generation, unless it is torn or the engine closed."""
        with self._lock:
            self._kept = None if held.torn or self._closed else held

    def close_kept(self) -> None:
        """Drop the kept cache (the next prompt prefills in full)."""
        with self._lock:
            self._kept = None

    def close(self) -> None:
        """Drop the kept cache; later give-backs are dropped too."""
        with self._lock:
            self._closed = True
            self._kept = None


def kv_cache(model: PreTrainedModel, kept: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword argument that hands `model` its KV cache: `cache` where its forward takes
    that name (transformers 5.2x on), else `past_key_values` (earlier 5.x, whose models
    pass an unknown `cache` on to attention, which ignores it: no earlier token is seen)."""
    return {_cache_keyword(type(model).forward): kept}


@cache
def _cache_keyword(forward: Callable[..., Any]) -> str:
    """The keyword a model class's `forward` takes its cache by (looked up once a class)."""
    names = inspect.signature(forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def batchable(config: PreTrainedConfig) -> bool:
    """Whether the model's cache is plain full attention on every layer: padded rows need it
    (sliding-window and recurrent layers are served serially), and so does a stored prefix,
    copied and cut position by position."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def restored(
    store: PromptCache,
    ids: Sequence[int],
    key: Hashable,
    config: PreTrainedConfig,
    device: torch.device,
    at_least: int = 0,
) -> Held | None:
    """A copy of the stored cache sharing the longest prefix with `ids` under `key` (more
    than `at_least`), cut to that prefix, on `device`; None when none does."""
    found = store.best(ids, key, at_least=at_least)
    if found is None:
        return None
    held = found.entry.state
    assert isinstance(held, Held)
    return copied(held, found.shared, config, device)


def stored(store: PromptCache, held: Held, config: PreTrainedConfig, *, copy: bool = False) -> None:
    """Put `held` in the store, in host memory: a copy when it is on a GPU (or `copy`)."""
    host = torch.device("cpu")
    if copy or _device(held) != host:
        held = copied(held, len(held.ids), config, host)
    store.put(held.ids, held.key, held, nbytes(held))


def copied(
    held: Held, length: int, config: PreTrainedConfig, device: torch.device | None = None
) -> Held:
    """A cache of its own holding `held`'s first `length` positions (new tensors), on
    `device` (None: where `held` is)."""
    cache = DynamicCache(config=config)
    for source, layer in zip(_plain(held.cache), _plain(cache), strict=True):
        keys, values = source.keys, source.values
        assert keys is not None and values is not None, "a kept cache holds every layer"
        keys, values = keys[:, :, :length], values[:, :, :length]
        if device is None or device == keys.device:
            keys, values = keys.clone(), values.clone()
        else:
            keys, values = keys.to(device), values.to(device)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return Held(cache, ids=list(held.ids[:length]), key=held.key)


def _device(held: Held) -> torch.device:
    """Where `held`'s keys are (the CPU while it holds none)."""
    for layer in _plain(held.cache):
        if layer.keys is not None:
            return layer.keys.device
    return torch.device("cpu")


def nbytes(held: Held) -> int:
    """The bytes `held`'s keys and values take."""
    total = 0
    for layer in _plain(held.cache):
        for states in (layer.keys, layer.values):
            if states is not None:
                total += states.numel() * states.element_size()
    return total


def _plain(cache: DynamicCache) -> list[DynamicLayer]:
    return cast(list[DynamicLayer], cache.layers)


def usable_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading ids `cached` and `prompt` share, leaving `prompt`'s last one to run."""
    limit = min(len(cached), len(prompt) - 1)
    for i in range(limit):
        if cached[i] != prompt[i]:
            return i
    return max(limit, 0)


def crop(held: Held, length: int) -> bool:
    """Cut `held` back to its first `length` tokens; False if the cache cannot be cut."""
    cache = held.cache
    size = cache.get_seq_length()
    if size != len(held.ids):
        return False
    if length == size:
        return True
    if not cache.is_croppable or any(cache.is_sliding):
        return False
    with torch.inference_mode():
        cache.crop(length - size)
    del held.ids[length:]
    return True
