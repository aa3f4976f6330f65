"""Continuous batching on transformers: left-padded rows of one KV cache, each steered its own way.

`Rows` keeps one `DynamicCache` whose batch axis holds the rows, right-aligned
(left-padded), with a 2-D attention mask that hides each row's padding and
per-row position ids that count only its own tokens, so a row computes what it
would alone (up to float rounding of the wider matmuls, docs/DECISIONS.md).

- `join` prefills a prompt alone (a batch of one, under the row's own
  steering), picks its first token, then merges its keys and values into the
  batch: the shorter side is left-padded to the longer. While other rows
  decode, the prompt is prefilled at the steps instead, `chunk` tokens a step
  after the decode, on its cache of its own (chunked prefill, issue 43: the
  decoding rows wait a chunk's pass a step, not a whole prompt's), and merged
  with its first token. A free kept cache
  whose ids share the longest prefix with the prompt, filled under the same
  steering state, saves that prefix's prefill (LOC-CHAT-43, per row).
- `step` feeds every row's newest token in one forward pass and picks each
  row's next from its own logits row with its own sampler (penalties, the
  grammar's mask, temperature, top_k, top_p). Each steered layer adds a
  `[rows, 1, width]` tensor: row r's own vector, zeros for rows without one,
  asked of each row's source at every pass (`steering.steered_rows`).
- `leave` takes the row out of the batch axis, cuts padding no row needs any
  more, and keeps the row's own keys and values for a later prompt that
  shares its prefix: in the engine's prompt cache when it has one (prefix.py,
  issue 43; a joining prompt starts from a copy of the best stored prefix, so
  the entry serves the next one too), else among the last `capacity` rows'.

Everything runs in the engine's one worker thread; nothing here is locked.
A pass that raised leaves the cache torn: every row is closed and the batch
starts empty.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ..base import Logprobs, SamplingParams, SteeringSource, Token
from ..monitor import Monitor
from ..prompt_cache import PromptCache
from ..rows import prefill_limit, prompt_row
from .capture import monitored, monitored_rows
from .decoding import DecodeSettings, Sampler, pick_rows
from .grammar import TorchMask
from .prefix import Held, crop, kv_cache, restored, stored, usable_prefix
from .steering import steered, steered_rows


@dataclass(eq=False, slots=True, kw_only=True)
class Row:
    """One row of the batch: the ids its keys and values hold, and how it samples."""

    ids: list[int]  # the ids its KV holds, in order (the newest token is not fed yet)
    last: Token  # the newest token picked, not yet fed
    budget: int  # tokens it may generate: max_tokens, cut to what the window leaves
    sampler: Sampler  # its penalties, bias, grammar and logprobs (decoding.py)
    steering: SteeringSource | None = None
    monitor: Monitor | None = None  # what the row's probes read (engines/monitor.py)
    key: Hashable = ()  # the steering state its prefill ran under (for reuse of its KV)
    cached: int = 0  # prompt tokens a kept cache already held
    open: bool = True
    todo: list[int] = field(default_factory=list)  # prompt ids not prefilled yet
    own: Held | None = None  # its cache of its own while it prefills, before the merge

    @property
    def ready(self) -> bool:
        """Its prompt is prefilled, its first token picked and its cache merged."""
        return not self.todo


class Rows:
    """A batch of up to `capacity` rows decoded together on one padded KV cache."""

    def __init__(
        self,
        model: PreTrainedModel,
        settings: DecodeSettings,
        capacity: int,
        window: int,
        store: PromptCache | None = None,
        chunk: int = 0,
    ) -> None:
        self._model = model
        self._device = model.device  # every tensor made per step is made there
        self._settings = settings
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if settings.keeps_last_logits else {}
        self._rows: list[Row] = []  # in batch-axis order
        self._waiting: list[Row] = []  # rows still prefilling, on caches of their own
        self._cache: DynamicCache | None = None
        self._mask = self._ones(0, 0)
        self._kept: list[Held] = []  # caches of rows that left, most recent last (no store)
        self._store = store if store is not None and store.enabled else None
        self.capacity = capacity
        self.window = window
        self.chunk = chunk  # prompt tokens a step while rows decode; 0: a whole prompt

    # -- rows --------------------------------------------------------------------

    def join(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        rng: torch.Generator | None = None,
        guide: TorchMask | None = None,
        steering: SteeringSource | None = None,
        monitor: Monitor | None = None,
        now: bool | None = None,
    ) -> Row:
        """Prefill `prompt_ids` alone under `steering`, pick its first token, then merge its
        keys and values into the batch; while other rows are busy (or `now` is False), leave
        it to the steps (`step`), not ready. A monitored row reads every position: no kept
        prefix."""
        ids = prompt_row(prompt_ids, self.window)
        if len(self._rows) + len(self._waiting) >= self.capacity:
            raise RuntimeError("every row of the batch is taken")
        key = () if steering is None else steering.key()
        held, cached = self._take(ids, key, reuse=rng is None and monitor is None)
        row = Row(
            ids=held.ids,  # the same list: it grows as `held` is fed
            last=Token(token_id=-1, eos=False),
            budget=min(params.max_tokens, self.window - len(ids)),
            sampler=Sampler(params, rng, guide),
            steering=steering,
            monitor=monitor,
            key=key,
            cached=cached,
            todo=ids[cached:],
            own=held,
        )
        if now is False or (now is None and self.busy):  # prefilled at the steps
            self._waiting.append(row)
        else:
            self._prefill(row, None)
        return row

    @property
    def busy(self) -> bool:
        """Whether any row is open."""
        return bool(self._rows or self._waiting)

    def step(self, rows: Sequence[Row], *, decode: bool = True, cap: int | None = None) -> None:
        """Feed every ready row's newest token in one forward pass and pick each one's next
        (`row.last`); then prefill the rows not ready, in `rows`' order, `chunk` tokens when a
        row decoded, else every one's whole prompt. `rows` must be the open rows: the batch
        axis holds the ready ones. `decode` False: no row decodes; `cap`: at most this many
        prompt tokens when rows decoded."""
        ready = [r for r in rows if r.ready]
        waiting = [r for r in rows if not r.ready]
        same = {id(r) for r in ready} == {id(r) for r in self._rows}
        if not same or {id(r) for r in waiting} != {id(r) for r in self._waiting}:
            raise ValueError("a step feeds every open row of the batch")
        if ready and decode:
            self._decode()
        limit = prefill_limit(self.chunk, decoded=bool(ready) and decode, cap=cap)
        for row in waiting:
            if limit is not None and limit <= 0:
                break
            fed = len(row.todo) if limit is None else min(limit, len(row.todo))
            self._prefill(row, fed)
            limit = None if limit is None else limit - fed

    def _prefill(self, row: Row, count: int | None) -> None:
        """Run the next `count` (None: all) of `row`'s prompt ids not yet run, on its own
        cache, under its steering and probes; when none is left, pick its first token and
        merge its cache into the batch."""
        held = row.own
        assert held is not None
        ids = row.todo if count is None else row.todo[:count]
        steering, monitor = row.steering, row.monitor
        hooks = nullcontext() if steering is None else steered(self._model, steering)
        reads = nullcontext() if monitor is None else monitored(self._model, monitor)
        with hooks, reads, torch.inference_mode():
            logits = held.feed(self._model, ids, self._extra).float()
        row.todo = row.todo[len(ids) :]
        if row.todo:
            return
        row.last = self._pick(row, logits)
        if row in self._waiting:
            self._waiting.remove(row)
        row.own = None
        self._merge(row, held.cache)

    def _decode(self) -> None:
        """One token for every row of the batch axis."""
        assert self._cache is not None
        tokens = [r.last.token_id for r in self._rows]
        positions = [len(r.ids) for r in self._rows]
        mask = torch.cat([self._mask, self._ones(len(tokens), 1)], dim=1)
        rows_steering = steered_rows(self._model, [r.steering for r in self._rows])
        reads = monitored_rows(self._model, [r.monitor for r in self._rows])
        try:
            with rows_steering, reads, torch.inference_mode():
                out = self._model(
                    input_ids=self._longs(tokens)[:, None],
                    attention_mask=mask,
                    position_ids=self._longs(positions)[:, None],
                    use_cache=True,
                    **kv_cache(self._model, self._cache),
                    **self._extra,
                )
        except BaseException:
            self._reset()  # some layers took the step and others not: the cache is torn
            raise
        self._mask = mask
        for row in self._rows:
            row.sampler.counts.add(row.last.token_id)
            row.ids.append(row.last.token_id)
        picks = pick_rows(out.logits[:, -1].float(), [r.sampler for r in self._rows])
        for row, (token_id, logprobs) in zip(self._rows, picks, strict=True):
            row.last = self._token(token_id, logprobs)

    def leave(self, row: Row) -> None:
        """Take the row out of the batch; its keys and values are kept for a later prompt that
        shares its prefix."""
        if not row.open:
            return
        row.open = False
        one_state = row.steering is None or not row.steering.mixed()  # its KV is keyable
        if row.own is not None:  # still prefilling: what ran is kept, unless torn
            self._waiting.remove(row)
            held, row.own = row.own, None
            if held.ids and not held.torn and one_state:
                self._keep(held)
            return
        index = next(i for i, r in enumerate(self._rows) if r is row)
        if one_state:
            self._keep(self._kept_copy(index, row))
        del self._rows[index]
        self._select([i for i in range(len(self._rows) + 1) if i != index])

    def close(self) -> None:
        """Drop the cache and the kept ones; open rows fail at their next step."""
        self._reset()
        self._kept = []

    # -- inside ------------------------------------------------------------------

    def _take(self, ids: list[int], key: Hashable, *, reuse: bool) -> tuple[Held, int]:
        """A kept cache holding the longest usable prefix of `ids` under `key`, cut to it,
        and its length; a fresh cache when none shares one."""
        if self._store is not None:
            config = self._model.config
            found = restored(self._store, ids, key, config, self._device) if reuse else None
            if found is not None:
                return found, len(found.ids)
            return Held(DynamicCache(config=self._model.config), key=key), 0
        best, length = None, 0
        if reuse:
            for held in self._kept:
                shared = usable_prefix(held.ids, ids) if held.key == key else 0
                if shared > length:
                    best, length = held, shared
        if best is not None:
            self._kept.remove(best)
            if crop(best, length):
                return best, length
        return Held(DynamicCache(config=self._model.config), key=key), 0

    def _kept_copy(self, index: int, row: Row) -> Held:
        """Row `index`'s keys and values, without its padding, as a cache of its own."""
        cache = self._cache
        assert cache is not None
        pad = int(cache.get_seq_length()) - len(row.ids)
        kept = DynamicCache(config=self._model.config)
        for source, layer in zip(_layers(cache), _layers(kept), strict=True):
            keys, values = _states(source)
            layer.lazy_initialization(keys, values)
            layer.keys = keys[index : index + 1, :, pad:].clone()
            layer.values = values[index : index + 1, :, pad:].clone()
        return Held(kept, ids=row.ids, key=row.key)

    def _keep(self, held: Held) -> None:
        if self._store is not None:
            stored(self._store, held, self._model.config)
            return
        self._kept.append(held)
        del self._kept[: -self.capacity]

    def _merge(self, row: Row, cache: DynamicCache) -> None:
        """Append the row's cache (a batch of one) to the batch axis, left-padding the shorter."""
        length = len(row.ids)
        if self._cache is None:
            self._cache = cache
            self._mask = self._ones(1, length)
            self._rows = [row]
            return
        total = int(self._cache.get_seq_length())
        width = max(total, length)
        for mine, theirs in zip(_layers(self._cache), _layers(cache), strict=True):
            (keys, values), (new_keys, new_values) = _states(mine), _states(theirs)
            mine.keys = torch.cat([_pad(keys, width - total), _pad(new_keys, width - length)])
            mine.values = torch.cat([_pad(values, width - total), _pad(new_values, width - length)])
        ones = self._ones(1, length)
        self._mask = torch.cat(
            [_pad_mask(self._mask, width - total), _pad_mask(ones, width - length)]
        )
        self._rows.append(row)

    def _select(self, indices: list[int]) -> None:
        """Keep only the batch rows at `indices`, and cut leading columns no row attends to."""
        if not indices or self._cache is None:
            self._reset()
            return
        picked = self._longs(indices)
        mask = self._mask[picked]
        start = int(torch.nonzero(mask.any(dim=0))[0, 0])
        for layer in _layers(self._cache):
            keys, values = _states(layer)
            layer.keys = keys[picked, :, start:]
            layer.values = values[picked, :, start:]
        self._mask = mask[:, start:]

    def _reset(self) -> None:
        for row in [*self._rows, *self._waiting]:
            row.open = False
        self._rows, self._waiting = [], []
        self._cache = None
        self._mask = self._ones(0, 0)

    def _ones(self, rows: int, width: int) -> torch.Tensor:
        """An attention mask of ones on the model's device."""
        return torch.ones((rows, width), dtype=torch.long, device=self._device)

    def _longs(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self._device)

    def _pick(self, row: Row, logits: torch.Tensor) -> Token:
        token_id, logprobs = row.sampler.pick(logits)  # the guide advanced with the pick
        return self._token(token_id, logprobs)

    def _token(self, token_id: int, logprobs: Logprobs | None) -> Token:
        return Token(token_id=token_id, eos=token_id in self._settings.eos_ids, logprobs=logprobs)


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers: plain full-attention ones (`batchable`)."""
    return cast(list[DynamicLayer], cache.layers)


def _states(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = layer.keys, layer.values
    if keys is None or values is None:
        raise RuntimeError("a cache layer holds no keys yet")
    return keys, values


def _pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """`states` ([rows, heads, length, dim]) with `width` zero positions in front."""
    if width == 0:
        return states
    shape = (states.shape[0], states.shape[1], width, states.shape[3])
    return torch.cat([states.new_zeros(shape), states], dim=2)


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    if width == 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], width)), mask], dim=1)
