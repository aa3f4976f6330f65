"""Continuous batching on llama.cpp: many sequences, one `llama_decode` per step.

`Rows` owns a second llama.cpp context over the same model, made with
`n_seq_max` sequences, each with its own KV stream of `window` tokens
(`kv_unified` off; the engine gives each row its share of the serial
window, as llama.cpp's server splits `-c` among `-np` slots). A row is one
sequence:

- `join_all` takes a free sequence for each prompt and, when no other row
  decodes, prefills it and picks its first token. The free sequence kept
  from an earlier row whose ids share the longest prefix with the prompt is
  taken, and that prefix is not run again (LOC-CHAT-43, per slot);
  otherwise the least recently used one. Prompts
  that arrived together are joined together: each takes its
  sequence first (those whose kept prefix lies at an end of the busy block
  first, so that no KV is copied where none need be), then what is new of
  every prompt runs in the same batches, as llama.cpp's server prefills its
  slots, rather than one forward pass or more per prompt.
- `step` feeds every decoding row's newest token in one batch and picks each
  row's next token from its own logits row: its own penalties and grammar
  mask, then its own sampler (sampling.py: greedy, or a chain with its
  temperature, top_k, top_p and seed), as the serial path
  (`context.Context.pick`) does. A row that joined while others decoded is
  prefilled there, `chunk` prompt tokens a step after the decode (chunked
  prefill, issue 43: the decoding rows wait a chunk's pass a step, not a
  whole prompt's; 0 prefills it whole at its first step); it is `ready`
  once its first token is picked.
- `leave` frees the row's sequence; its KV stays for the next row that shares
  its prefix.

Steering (issue 46) is the context's control vector (steering.py), one per
decode: a step decodes the ready rows in groups that add the same vectors,
each group one decode under its vector (rows unsteered are a group too), and
a prefill runs each group's tokens apart in the same way. Every row reads its
source once a pass, as a transformers hook does. A sequence's KV is kept with
the steering state it was computed under, and is reused (or cached, restored)
only for a prompt under the same state.

A row's probe monitor (engines/monitor.py) is fed through the context's tap
(tap.py): at a step, the rows of the group it decodes in are read at its
layers and it takes its own row; its prompt is prefilled on its own, so every
row the tap reads there is its. A monitored row reuses no kept prefix: its
values cover every prompt position. The context takes the tap when the first
monitored row joins (`_take_tap`): until then it runs no callback.

One step must be one forward pass. With a KV stream per sequence, llama.cpp
cuts a batch into micro-batches wherever a token's sequence id is not the
previous one's plus one (`split_equal`, sequential), and each micro-batch
reads every weight again: rows on sequences 0 and 2, or fed as 1 then 0,
cost two passes. So the busy sequences are kept one unbroken block and a
step feeds its rows in sequence order. A row joins at either end of the
block or in a hole inside it (when the sequence holding its prefix is
elsewhere, that sequence's KV is copied there: `llama_memory_seq_cp` copies
a whole stream); a hole that a row left inside the block and no row joined
is filled, before the next step, by moving the block's last row into it, KV
and all (rows that end in the same step all leave, and none moves).

Everything runs in the engine's one worker thread; nothing here is locked.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np
from llama_cpp import _internals

from ..base import Hooks, SamplingParams, SteeringSource, Token
from ..grammar import Mask
from ..monitor import Monitor
from ..prompt_cache import PromptCache
from ..rows import prefill_limit, prompt_row
from .batches import put
from .sampling import Logits, Picking
from .states import States
from .steering import MIXED, ControlVector, Vectors, key_of, same, vectors_of
from .tap import Observer, Tap


@dataclass(eq=False, slots=True, kw_only=True)
class Row:
    """One sequence of the batch: where it stands and how it samples."""

    seq: int
    held: list[int]  # the ids its KV holds, in order
    todo: list[int]  # its prompt's ids not prefilled yet (chunked prefill); none once ready
    last: Token  # the newest token picked, not yet fed (its first once `ready`)
    budget: int  # tokens it may generate: max_tokens, cut to what the window leaves
    picking: Picking  # its penalties, bias, grammar, sampler and logprobs (sampling.py)
    cached: int = 0  # prompt tokens its sequence already held
    open: bool = True
    steering: SteeringSource | None = None
    key: Hashable = ()  # the steering state its KV is computed under (MIXED: more than one)
    observer: Observer | None = None  # what its probe monitor reads (tap.py)

    @property
    def ready(self) -> bool:
        """Its prompt is prefilled and `last` holds a token picked."""
        return not self.todo


@dataclass(frozen=True, slots=True)
class Joining:
    """A prompt for `Rows.join_all`, with its sampling."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    seed: int | None = None
    guide: Mask | None = None
    steering: SteeringSource | None = None
    monitor: Monitor | None = None


@dataclass(slots=True)
class _Sequence:
    held: list[int] = field(default_factory=list)
    used: int = 0  # when it was last taken, for least-recently-used reuse
    row: Row | None = None  # the row decoding on it; None while free
    key: Hashable = ()  # the steering state `held` was computed under


@dataclass(slots=True)
class _Group:
    """Rows a pass runs together: they add the same steering vectors."""

    vectors: Vectors
    rows: list[Row] = field(default_factory=list)

    @property
    def layers(self) -> set[int]:
        """The layers its monitored rows read."""
        return {layer for row in self.rows if row.observer for layer in row.observer.layers}


class Rows:
    """A batch of up to `capacity` rows decoded together on one llama.cpp context."""

    def __init__(
        self,
        llama: llama_cpp.Llama,
        capacity: int,
        window: int,
        cache: PromptCache | None = None,
        chunk: int = 0,
    ) -> None:
        # the serial context's own parameters (threads, batch sizes, attention kernel), so a
        # row computes as the serial path does; only the sequences and their room differ
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        params.n_ctx = window * capacity
        params.n_seq_max = capacity
        params.kv_unified = False
        params.embeddings = False
        params.cb_eval = ctypes.cast(0, llama_cpp.ggml_backend_sched_eval_callback)  # none
        self._params = params
        self._llama = llama
        self._n_layer = int(llama_cpp.llama_model_n_layer(llama.model))
        self._tap = Tap(int(llama.n_embd()), self._n_layer)  # on the context once a row reads
        self._tapped = False
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._n_batch = int(params.n_batch)
        self._batch = llama_cpp.llama_batch_init(max(self._n_batch, capacity), 0, 1)
        self._sequences = [_Sequence() for _ in range(capacity)]
        self._clock = itertools.count(1)
        self.capacity = capacity
        self.window = window
        self.chunk = chunk  # prompt tokens a step while rows decode; 0: a whole prompt
        self._closed = False
        self._cache = cache
        # sequences a copy reads or writes at the next decode (llama.cpp copies a stream's
        # data then, its cells at once): their KV is neither saved nor restored until then
        self._copying: set[int] = set()
        self._bind(_internals.LlamaContext(model=llama._model, params=params, verbose=False))

    def _bind(self, context: _internals.LlamaContext) -> None:
        """Make `context` the batch's, and what holds its pointer anew."""
        self._context = context
        self._ctx = context.ctx
        self._cvec = ControlVector(self._ctx, int(self._llama.n_embd()), self._n_layer)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._logits = Logits(self._ctx, int(self._llama.n_vocab()))
        cache = self._cache
        self._states = None
        if cache is not None and cache.enabled:  # states keyed by the batch's streams
            self._states = States(self._ctx, cache, self.capacity)

    @property
    def tapped(self) -> bool:
        """Whether the context carries the tap yet (a monitored row has joined)."""
        return self._tapped

    # -- rows --------------------------------------------------------------------

    def join_all(self, joiners: Sequence[Joining]) -> list[Row]:
        """Join each, the rows in `joiners`' order. When no other row is busy their new
        tokens are prefilled together and each is `ready`; else at the next steps (`step`).
        A failed prefill leaves every one of their sequences free and raises."""
        self._check_open()
        if any(j.monitor is not None for j in joiners):
            self._take_tap()
        prompts = [prompt_row(j.prompt_ids, self.window) for j in joiners]
        busy = len(self._busy())
        if len(prompts) > self.capacity - busy:
            raise RuntimeError("every row of the batch is taken")
        rows: list[Row | None] = [None] * len(joiners)
        try:
            left = list(range(len(joiners)))
            while left:
                i = self._next_joiner(left, prompts, joiners)
                left.remove(i)
                joiner = joiners[i]
                reuse = joiner.monitor is None  # a monitored row reads every position
                seq, kept = self._take(prompts[i], key_of(joiner.steering), reuse)
                made = self._row(seq, prompts[i], kept, joiner)
                self._sequences[seq].row = made  # busy now: the next one takes an end beside it
                rows[i] = made
            if not busy:  # no row waits for this prefill; in sequence order, few micro-batches
                self._prefill(sorted((r for r in rows if r is not None), key=lambda r: r.seq), None)
        except BaseException:
            for row in rows:
                if row is not None:  # its sequence free again, holding what its KV surely does
                    row.open = False
                    row.picking.close()
                    self._sequences[row.seq].row = None
                    self._sequences[row.seq].held = row.held[: row.cached]
                    self._sequences[row.seq].key = row.key
            raise
        return [row for row in rows if row is not None]

    def _next_joiner(
        self, left: list[int], prompts: list[list[int]], joiners: Sequence[Joining]
    ) -> int:
        """Which of the prompts `left` takes its sequence next: of those whose best kept
        prefix lies at an end of the busy block, the one that keeps most (it takes that
        sequence as it is, copying no KV); when none does, the first."""
        ends = self._ends()
        free = [n for n, s in enumerate(self._sequences) if s.row is None]
        best: tuple[int, int] | None = None  # (kept, -i)
        for i in left:
            key = key_of(joiners[i].steering)
            kept = {n: self._shared(n, prompts[i], key) for n in free}
            at_end = max(kept[n] for n in ends)
            if at_end == max(kept.values()) and (best is None or (at_end, -i) > best):
                best = (at_end, -i)
        return left[0] if best is None else -best[1]

    def _row(self, seq: int, ids: list[int], kept: int, joiner: Joining) -> Row:
        return Row(
            seq=seq,
            held=ids[:kept],
            todo=ids[kept:],
            last=Token(token_id=-1, eos=False),
            budget=min(joiner.params.max_tokens, self.window - len(ids)),
            picking=Picking(joiner.params, joiner.seed, joiner.guide),
            cached=kept,
            steering=joiner.steering,
            key=self._sequences[seq].key,
            observer=Observer.of(Hooks(monitor=joiner.monitor)),
        )

    def step(self, rows: Sequence[Row], *, decode: bool = True, cap: int | None = None) -> None:
        """Feed each ready row's newest token, in one decode, and pick each one's next
        (`row.last`); then prefill the rows not ready, in `rows`' order: `chunk` tokens
        when a row decoded, else every one's whole prompt. A row whose prompt ends in this
        step gets its first token and is ready. `decode` False: no row decodes; `cap`: at
        most this many prompt tokens when rows decoded."""
        self._check_open()
        self._compact()
        ready = sorted((r for r in rows if r.ready and decode), key=lambda r: r.seq)
        waiting = [r for r in rows if not r.ready]
        for group in self._groups(ready):  # one decode for rows steered alike
            batch = self._batch
            for i, row in enumerate(group.rows):
                token = row.last.token_id
                put(batch, i, token, len(row.held), row.seq, True)
            batch.n_tokens = len(group.rows)
            self._decode(group.vectors, group.layers)
            self._observed(group)
            for i, row in enumerate(group.rows):
                row.picking.took(row.last.token_id)
                row.held.append(row.last.token_id)
                row.last = self._pick(row, i)
        if waiting:
            self._prefill(waiting, prefill_limit(self.chunk, decoded=bool(ready), cap=cap))

    def leave(self, row: Row) -> None:
        """Free the row's sequence; its KV stays for a later row that shares its prefix."""
        if not row.open:
            return
        row.open = False
        row.picking.close()
        sequence = self._sequences[row.seq]
        sequence.held, sequence.row = row.held, None
        mixed = row.steering is not None and row.steering.mixed()
        sequence.key = MIXED if mixed else row.key
        # a hole left inside the block is filled by a joiner, or at the next step (`_compact`):
        # rows that end in the same step leave one by one, and none of them moves

    def close(self) -> None:
        """Free the context and the batch; a row still open fails at its next step."""
        if self._closed:
            return
        self._closed = True
        llama_cpp.llama_batch_free(self._batch)
        self._context.close()  # type: ignore[no-untyped-call]

    # -- inside ------------------------------------------------------------------

    def _take_tap(self) -> None:
        """Make the context anew with the tap as its evaluation callback, the first time a
        monitored row joins (until then none runs: the idle callback's calls from C into
        Python, about 940 a step, cost a step a few percent in a server whose event loop
        wants the same interpreter). Every sequence's KV goes over to the new context
        (`llama_state_seq_get_data`, then `set_data`): the busy rows go on decoding, the
        free ones keep their prefixes. A free sequence a pending copy writes is dropped;
        a busy one cannot be (a step decodes after every join while rows are busy)."""
        if self._tapped:
            return
        states: dict[int, ctypes.Array[ctypes.c_ubyte]] = {}
        for n, sequence in enumerate(self._sequences):
            if n in self._copying:
                if sequence.row is not None:
                    raise RuntimeError("a busy row's KV is still being copied")
                sequence.held, sequence.key = [], ()
                continue
            size = int(llama_cpp.llama_state_seq_get_size(self._ctx, n))
            if size <= 0 or llama_cpp.llama_memory_seq_pos_max(self._memory, n) < 0:
                continue
            buffer = (ctypes.c_ubyte * size)()
            if int(llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, n)) <= 0:
                raise RuntimeError(f"saving sequence {n}'s state failed")
            states[n] = buffer
        self._copying.clear()
        self._context.close()  # type: ignore[no-untyped-call]
        self._params.cb_eval = self._tap.callback
        try:
            made = _internals.LlamaContext(
                model=self._llama._model, params=self._params, verbose=False
            )
        except BaseException:
            self._closed = True  # no context left: every later call fails, none crashes
            llama_cpp.llama_batch_free(self._batch)
            raise
        self._tapped = True
        self._bind(made)
        for n, buffer in states.items():
            if int(llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(buffer), n)) > 0:
                continue
            llama_cpp.llama_memory_seq_rm(self._memory, n, -1, -1)
            if self._sequences[n].row is not None:
                raise RuntimeError(f"restoring sequence {n}'s state failed")
            self._sequences[n].held, self._sequences[n].key = [], ()  # a free one: forgotten

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the llama.cpp batch context is closed")

    def _busy(self) -> list[int]:
        """The busy sequences, in order."""
        return [n for n, s in enumerate(self._sequences) if s.row is not None]

    def _ends(self) -> list[int]:
        """The free sequences a row may join on and keep the busy ones one block: the holes
        in the block and those next to it, or every one when none is busy."""
        busy = self._busy()
        if not busy:
            return list(range(self.capacity))
        around = range(max(busy[0] - 1, 0), min(busy[-1] + 2, self.capacity))
        return [n for n in around if self._sequences[n].row is None]

    def _compact(self) -> None:
        """Close the holes in the busy block: the block's last row moves into each."""
        busy = self._busy()
        while busy and busy[-1] - busy[0] + 1 > len(busy):
            hole = next(n for n in range(busy[0], busy[-1]) if self._sequences[n].row is None)
            self._move(busy[-1], hole)
            busy = self._busy()

    def _shared(self, n: int, ids: list[int], key: Hashable) -> int:
        """How many of `ids` sequence `n` holds (at most all but the last) computed under the
        steering state `key` (none under another)."""
        if self._sequences[n].key != key:
            return 0
        held = self._sequences[n].held
        limit = min(len(held), len(ids) - 1)
        differ = np.flatnonzero(np.asarray(held[:limit]) != np.asarray(ids[:limit]))
        return int(differ[0]) if differ.size else int(limit)

    def _take(self, ids: list[int], key: Hashable, reuse: bool = True) -> tuple[int, int]:
        """A free sequence for `ids` and how many of them its KV keeps (at most all but the
        last, so the last is run and its logits are fresh). The free sequence that shares
        most (the least recently used among equals) lends its KV to an end of the block
        when it is not one; when the prompt cache holds a longer prefix than any free
        sequence, it is restored there instead (states.py). What the taken sequence drops
        is saved to the prompt cache first (a copy's target is saved by `_copy`). Only KV
        computed under the prompt's steering state `key` is kept or restored; none without
        `reuse`."""
        ends = self._ends()
        if not ends:
            raise RuntimeError("every row of the batch is taken")
        sequences = self._sequences

        def shared(n: int) -> int:
            return self._shared(n, ids, key) if reuse else 0

        def rank(n: int) -> tuple[int, int]:
            return shared(n), -sequences[n].used

        n = max(ends, key=rank)
        free = [m for m, s in enumerate(sequences) if s.row is None]
        lender = max(free, key=rank)
        states = None if n in self._copying else self._states
        if states is not None and reuse:
            held = sequences[n]
            restored = states.restore(n, ids, shared(lender), held.held, key, held.key)
            if restored is not None:
                held.used, held.held, held.key = next(self._clock), restored, key
                return n, len(restored)
        if shared(lender) > shared(n):
            spares = [m for m in free if m not in (n, lender)]
            if spares:  # what `n` held is not lost: the least recently used KV goes instead
                self._copy(n, min(spares, key=lambda m: sequences[m].used))
            self._copy(lender, n)
        elif states is not None and shared(n) < len(sequences[n].held):
            states.save(n, sequences[n].held, sequences[n].key)  # it stays in the prompt cache
        kept = shared(n)
        if not llama_cpp.llama_memory_seq_rm(self._memory, n, kept, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, n, -1, -1)
            kept = 0
        sequences[n].used, sequences[n].held = next(self._clock), ids[:kept]
        sequences[n].key = key
        return n, kept

    def _copy(self, source: int, target: int) -> None:
        """Sequence `target`'s KV becomes a copy of `source`'s (the whole stream, at the next
        decode, copies in the order made); `source` keeps its own. What `target` held is
        saved to the prompt cache first."""
        if self._states is not None and target not in self._copying:
            self._states.save(target, self._sequences[target].held, self._sequences[target].key)
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, -1, -1)
        self._copying |= {source, target}
        copied, original = self._sequences[target], self._sequences[source]
        copied.held, copied.used, copied.key = list(original.held), original.used, original.key

    def _move(self, source: int, target: int) -> None:
        """The row on `source` goes on to free `target`, its KV with it; `source` is left
        free, holding what the row held so far."""
        row = self._sequences[source].row
        assert row is not None
        self._sequences[source].held, self._sequences[source].key = list(row.held), row.key
        self._copy(source, target)
        self._sequences[target].row, self._sequences[source].row = row, None
        self._sequences[target].used = next(self._clock)
        row.seq = target

    def _prefill(self, rows: list[Row], limit: int | None) -> None:
        """Run the first `limit` (None: all) of the rows' prompt tokens not yet run
        (`todo`), the rows' in `rows`' order, in batches of up to n_batch tokens; a row
        whose last prompt token ran gets its first token, picked from that token's logits
        in the batch that held it. A row's `held` grows only once its batch ran (a failed
        decode keeps no cell of it)."""
        tokens = [(row, j) for row in rows for j in range(len(row.todo))][:limit]
        base = {id(row): len(row.held) for row in rows}  # where each row's todo starts
        ran = dict.fromkeys(base, 0)  # how many of each row's todo ran
        try:
            joining = list(dict.fromkeys(row for row, _ in tokens))
            for group in self._groups(joining, alone=True):
                members = {id(row) for row in group.rows}
                part = [(row, j) for row, j in tokens if id(row) in members]
                for start in range(0, len(part), self._n_batch):
                    self._prefill_chunk(part[start : start + self._n_batch], base, ran, group)
        finally:
            for row in rows:
                row.todo = row.todo[ran[id(row)] :]

    def _prefill_chunk(
        self,
        chunk: list[tuple[Row, int]],
        base: dict[int, int],
        ran: dict[int, int],
        group: _Group,
    ) -> None:
        """One batch of prompt tokens (row, index in its todo) of rows steered alike."""
        ends: list[tuple[Row, int]] = []
        layers = group.layers
        every = self._tap.reads_last(layers)  # the last layer read: every row's logits kept
        for i, (row, j) in enumerate(chunk):
            last = j == len(row.todo) - 1
            put(self._batch, i, row.todo[j], base[id(row)] + j, row.seq, last or every)
            if last:
                ends.append((row, i))
        self._batch.n_tokens = len(chunk)
        self._decode(group.vectors, layers)
        self._observed(group)
        for row, j in chunk:
            ran[id(row)] = j + 1
            row.held.append(row.todo[j])
        for row, i in ends:
            row.last = self._pick(row, i)

    def _groups(self, rows: Sequence[Row], alone: bool = False) -> list[_Group]:
        """`rows`, in order, parted by the vectors each adds in this pass (read now, as a
        hook reads them), with `alone` each monitored row in a group of its own; a row whose
        steering state moved since its KV began holds MIXED KV from here on."""
        groups: list[_Group] = []
        for row in rows:
            vectors = vectors_of(row.steering)
            if row.steering is not None and key_of(row.steering) != row.key:
                row.key = MIXED
            shared = [g for g in groups if not (alone and (row.observer or g.layers))]
            group = next((g for g in shared if same(g.vectors, vectors)), None)
            if group is None:
                group = _Group(vectors)
                groups.append(group)
            group.rows.append(row)
        return groups

    def _observed(self, group: _Group) -> None:
        """Each monitored row of `group` takes its own rows of the decode just run: one a
        step (the group's tokens in order), every one at its own prefill."""
        if not group.layers:
            return
        read = self._tap.take()
        if len(group.rows) == 1:
            [row] = group.rows
            assert row.observer is not None
            row.observer.feed(read, group.vectors)
            return
        for i, row in enumerate(group.rows):
            if row.observer is not None:
                row.observer.feed({k: v[i : i + 1] for k, v in read.items()}, group.vectors)

    def _decode(self, vectors: Vectors, layers: set[int]) -> None:
        self._cvec.set(vectors)
        self._tap.want(layers)
        status = llama_cpp.llama_decode(self._ctx, self._batch)
        self._copying.clear()  # a decode applies the copies first
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")

    def _pick(self, row: Row, index: int) -> Token:
        """Row's next token from the logits at batch `index` (`Picking`, as the serial path)."""
        return row.picking.pick(self._logits, index, self._vocab)
