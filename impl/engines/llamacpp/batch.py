"""Continuous batching on llama.cpp: many sequences, one `llama_decode` per step.

`Rows` owns a second llama.cpp context over the same model, made with
`n_seq_max` sequences, each with its own KV stream of `window` tokens
(`kv_unified` off; the engine gives each row its share of the serial
window, as llama.cpp's server splits `-c` among `-np` slots). A row is one
sequence:

- `join` prefills a prompt into a free sequence and picks its first token.
  The free sequence kept from an earlier row whose ids share the longest
  prefix with the prompt is taken, and that prefix is not run again
  (LOC-CHAT-43, per slot); otherwise the least recently used one.
- `step` feeds every row's newest token in one batch and picks each row's
  next token from its own logits row: its own penalties and grammar mask,
  then its own sampler (sampling.py: greedy, or a chain with its
  temperature, top_k, top_p and seed), as the serial path
  (`context.Context.pick`) does.
- `leave` frees the row's sequence; its KV stays for the next row that shares
  its prefix.

One step must be one forward pass. With a KV stream per sequence, llama.cpp
cuts a batch into micro-batches wherever a token's sequence id is not the
previous one's plus one (`split_equal`, sequential), and each micro-batch
reads every weight again: rows on sequences 0 and 2, or fed as 1 then 0,
cost two passes. So the busy sequences are kept one unbroken block and a
step feeds its rows in sequence order. A row joins at either end of the
block (when the sequence holding its prefix is elsewhere, that sequence's
KV is copied there: `llama_memory_seq_cp` copies a whole stream); a row
that leaves from inside the block is filled by moving the block's last row
into its sequence, KV and all.

Everything runs in the engine's one worker thread; nothing here is locked.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import llama_cpp
import numpy as np
from llama_cpp import _internals

from ..base import SamplingParams, Token
from ..grammar import Guide
from ..rows import prompt_row
from .batches import fill, put
from .sampling import Logits, Penalties, Sampler, is_no_op_penalty, sampler


@dataclass(eq=False, slots=True, kw_only=True)
class Row:
    """One sequence of the batch: where it stands and how it samples."""

    seq: int
    held: list[int]  # the ids its KV holds, in order
    last: Token  # the newest token picked, not yet fed
    budget: int  # tokens it may generate: max_tokens, cut to what the window leaves
    sampler: Sampler
    penalties: Penalties | None = None
    guide: Guide | None = None
    cached: int = 0  # prompt tokens its sequence already held
    open: bool = True


@dataclass(slots=True)
class _Sequence:
    held: list[int] = field(default_factory=list)
    used: int = 0  # when it was last taken, for least-recently-used reuse
    row: Row | None = None  # the row decoding on it; None while free


class Rows:
    """A batch of up to `capacity` rows decoded together on one llama.cpp context."""

    def __init__(self, llama: llama_cpp.Llama, capacity: int, window: int) -> None:
        # the serial context's own parameters (threads, batch sizes, attention kernel), so a
        # row computes as the serial path does; only the sequences and their room differ
        params = llama_cpp.llama_context_params.from_buffer_copy(llama.context_params)
        params.n_ctx = window * capacity
        params.n_seq_max = capacity
        params.kv_unified = False
        params.embeddings = False
        self._context = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        self._ctx = self._context.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._logits = Logits(self._ctx, int(llama.n_vocab()))
        self._n_batch = int(params.n_batch)
        self._batch = llama_cpp.llama_batch_init(max(self._n_batch, capacity), 0, 1)
        self._sequences = [_Sequence() for _ in range(capacity)]
        self._clock = itertools.count(1)
        self.capacity = capacity
        self.window = window
        self._closed = False

    # -- rows --------------------------------------------------------------------

    def join(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        seed: int | None = None,
        guide: Guide | None = None,
    ) -> Row:
        """Prefill `prompt_ids` into a free sequence and pick its first token."""
        self._check_open()
        ids = prompt_row(prompt_ids, self.window)
        seq, kept = self._take(ids)
        index = self._prefill(seq, ids, kept)  # the sequence stays free if this fails
        penalties = None
        if not is_no_op_penalty(params.frequency_penalty, params.presence_penalty):
            penalties = Penalties(params.frequency_penalty, params.presence_penalty)
        row = Row(
            seq=seq,
            held=ids,
            last=Token(token_id=-1, eos=False),
            budget=min(params.max_tokens, self.window - len(ids)),
            sampler=sampler(params, seed),
            penalties=penalties,
            guide=guide,
            cached=kept,
        )
        row.last = self._pick(row, index)
        self._sequences[seq].row = row
        return row

    def step(self, rows: Sequence[Row]) -> None:
        """Feed each row's newest token, in one decode, and pick each row's next (`row.last`)."""
        self._check_open()
        batch = self._batch
        rows = sorted(rows, key=lambda row: row.seq)  # one micro-batch, not one per row
        for i, row in enumerate(rows):
            token = row.last.token_id
            if row.penalties is not None:
                row.penalties.add(token)
            put(batch, i, token, len(row.held), row.seq, True)
            row.held.append(token)
        batch.n_tokens = len(rows)
        self._decode()
        for i, row in enumerate(rows):
            row.last = self._pick(row, i)

    def leave(self, row: Row) -> None:
        """Free the row's sequence; its KV stays for a later row that shares its prefix."""
        if not row.open:
            return
        row.open = False
        row.sampler.close()
        sequence = self._sequences[row.seq]
        sequence.held, sequence.row = row.held, None
        busy = self._busy()
        if busy and busy[0] < row.seq < busy[-1]:  # a hole inside the block
            self._move(busy[-1], row.seq)

    def close(self) -> None:
        """Free the context and the batch; a row still open fails at its next step."""
        if self._closed:
            return
        self._closed = True
        llama_cpp.llama_batch_free(self._batch)
        self._context.close()  # type: ignore[no-untyped-call]

    # -- inside ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the llama.cpp batch context is closed")

    def _busy(self) -> list[int]:
        """The busy sequences, in order."""
        return [n for n, s in enumerate(self._sequences) if s.row is not None]

    def _ends(self) -> list[int]:
        """The free sequences a row may join on and keep the busy ones one block: those
        next to the block, or every one when none is busy."""
        busy = self._busy()
        if not busy:
            return list(range(self.capacity))
        return [n for n in (busy[0] - 1, busy[-1] + 1) if 0 <= n < self.capacity]

    def _take(self, ids: list[int]) -> tuple[int, int]:
        """A free sequence for `ids` and how many of them its KV keeps (at most all but the
        last, so the last is run and its logits are fresh). The free sequence that shares
        most (the least recently used among equals) lends its KV to an end of the block
        when it is not one."""
        ends = self._ends()
        if not ends:
            raise RuntimeError("every row of the batch is taken")
        sequences = self._sequences

        def shared(n: int) -> int:
            limit = min(len(sequences[n].held), len(ids) - 1)
            held = np.asarray(sequences[n].held[:limit])
            differ = np.flatnonzero(held != np.asarray(ids[:limit]))
            return int(differ[0]) if differ.size else int(limit)

        def rank(n: int) -> tuple[int, int]:
            return shared(n), -sequences[n].used

        n = max(ends, key=rank)
        free = [m for m, s in enumerate(sequences) if s.row is None]
        lender = max(free, key=rank)
        if shared(lender) > shared(n):
            spares = [m for m in free if m not in (n, lender)]
            if spares:  # what `n` held is not lost: the least recently used KV goes instead
                self._copy(n, min(spares, key=lambda m: sequences[m].used))
            self._copy(lender, n)
        kept = shared(n)
        if not llama_cpp.llama_memory_seq_rm(self._memory, n, kept, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, n, -1, -1)
            kept = 0
        sequences[n].used, sequences[n].held = next(self._clock), ids[:kept]
        return n, kept

    def _copy(self, source: int, target: int) -> None:
        """Sequence `target`'s KV becomes a copy of `source`'s (the whole stream, at the next
        decode, copies in the order made); `source` keeps its own."""
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, -1, -1)
        copied, original = self._sequences[target], self._sequences[source]
        copied.held, copied.used = list(original.held), original.used

    def _move(self, source: int, target: int) -> None:
        """The row on `source` goes on to free `target`, its KV with it; `source` is left
        free, holding what the row held so far."""
        row = self._sequences[source].row
        assert row is not None
        self._sequences[source].held = list(row.held)
        self._copy(source, target)
        self._sequences[target].row, self._sequences[source].row = row, None
        self._sequences[target].used = next(self._clock)
        row.seq = target

    def _prefill(self, seq: int, ids: list[int], kept: int) -> int:
        """Run `ids[kept:]` on `seq` in chunks of n_batch; the batch index of the last."""
        for start in range(kept, len(ids), self._n_batch):
            fill(self._batch, ids[start : start + self._n_batch], start, seq, len(ids) - 1)
            self._decode()
        return (len(ids) - kept - 1) % self._n_batch

    def _decode(self) -> None:
        status = llama_cpp.llama_decode(self._ctx, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")

    def _pick(self, row: Row, index: int) -> Token:
        """Row's next token from the logits at batch `index`: penalties, then the guide's
        mask, are written into the row the sampler reads."""
        if row.penalties is not None or row.guide is not None:
            view = self._logits.row(index)
            if row.penalties is not None:
                row.penalties.apply(view)
            if row.guide is not None:
                row.guide.mask_row(view)
        token_id = row.sampler.pick(self._logits, index)
        if row.guide is not None:
            row.guide.advance(token_id)
        return Token(
            token_id=token_id, eos=bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))
        )
