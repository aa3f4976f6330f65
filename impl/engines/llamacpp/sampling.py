"""Picking the next token on llama.cpp: its sampler chain plus our penalty.

The chain holds only what the request asks for, so none of llama.cpp's
defaults (top_k 40, min_p 0.05, repeat_penalty 1.1 in some front ends)
alters sampling: at temperature 0 the first of the highest logits (`Greedy`),
else `top_k` (when the config's `top-k` is above 0), `temp`, then `top_p`
(when below 1), then `dist` (`Chain`). `Greedy` picks the token llama.cpp's
greedy sampler picks (the first maximum) by an argmax over the logits row in
place: the sampler first copies the whole row into a candidate array, about
60 us a token on SmolLM2's 49k vocabulary against under 10 (BENCHMARKS.md).
Temperature comes before top_p, as in the transformers engine
(`..transformers.sampling`), so both engines cut the same nucleus.

OpenAI's `frequency_penalty` (f) and `presence_penalty` (p) are mapped to the
same multiplicative repetition penalty as the transformers engine
(OAI-CHAT-24): a token generated `c >= 1` times in this completion (prompt
tokens not counted) gets the factor `exp(p + f * ln(1 + c))`; its logit `l`
becomes `l / factor` when `l > 0`, else `l * factor`. `Penalties` applies it
in place to the context's logits row (`Logits`) before the pick,
touching only the tokens generated so far; it is made only when a penalty is
non-zero, so the plain path does no per-token work in Python.

A seed makes a `Seeds` (the engine's `Rng`): each choice's `dist` sampler
takes the next 32-bit seed it draws, so `n` > 1 gives distinct choices and
the same seed gives the same ones again (OAI-SEED-05). Unseeded sampling
draws from a seed llama.cpp picks at random per choice.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import _internals

from ..base import Logprobs, SamplingParams, Token
from ..grammar import Mask
from ..logprobs import LogitBias, Reporter, logit_bias

MAX_VIEWS = 1024  # row views a context keeps (a batch of rows has one per row)


class Seeds:
    """A seeded request's source of sampler seeds: one per choice, the same every time."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def next(self) -> int:
        """The next choice's seed (never LLAMA_DEFAULT_SEED, which means "pick at random")."""
        return self._random.getrandbits(32) % llama_cpp.LLAMA_DEFAULT_SEED


def new_rng(seed: int | None) -> Seeds | None:
    """The seeds of a request seeded with `seed`; None (llama.cpp picks) when no seed."""
    return None if seed is None else Seeds(seed)


class Greedy:
    """Temperature 0: the first of the highest logits, read where llama.cpp left them."""

    def pick(self, logits: Logits, index: int) -> int:
        """The token after the batch's `index`th logits row (-1: the last)."""
        return int(logits.row(index).argmax())

    def close(self) -> None:
        """Nothing to free."""


class Chain:
    """llama.cpp's sampler chain: [top_k ->] temp -> top_p -> dist."""

    def __init__(self, chain: _internals.LlamaSampler) -> None:
        self._chain = chain

    def pick(self, logits: Logits, index: int) -> int:
        """The token after the batch's `index`th logits row (-1: the last)."""
        return int(llama_cpp.llama_sampler_sample(self._chain.sampler, logits.ctx, index))

    def close(self) -> None:
        self._chain.close()  # type: ignore[no-untyped-call]


Sampler = Greedy | Chain


def sampler(params: SamplingParams, seed: int | None = None) -> Sampler:
    """What picks a token for `params`: `Greedy` at temperature 0, else llama.cpp's chain
    (its `dist` seeded with `seed`, else at random)."""
    if params.temperature == 0:
        return Greedy()
    chain = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
    if params.top_k > 0:
        chain.add_top_k(params.top_k)
    chain.add_temp(params.temperature)
    if params.top_p < 1:
        chain.add_top_p(params.top_p, 1)
    chain.add_dist(llama_cpp.LLAMA_DEFAULT_SEED if seed is None else seed)
    return Chain(chain)


def is_no_op_penalty(frequency: float, presence: float) -> bool:
    """Whether these penalties change nothing (both zero)."""
    return frequency == 0 and presence == 0


def penalty_factors(
    counts: npt.NDArray[np.float32], frequency: float, presence: float
) -> npt.NDArray[np.float32]:
    """The repetition penalty for tokens seen `counts` (>= 1) times."""
    exponent = np.float32(presence) + np.float32(frequency) * np.log1p(counts)
    factors: npt.NDArray[np.float32] = np.exp(exponent).astype(np.float32)
    return factors


class Penalties:
    """The repetition penalty over the tokens generated so far in one completion."""

    def __init__(self, frequency: float, presence: float) -> None:
        self._frequency = frequency
        self._presence = presence
        self._counts: dict[int, int] = {}

    def add(self, token_id: int) -> None:
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        """Penalize `logits` (one row over the vocabulary) in place."""
        if not self._counts:
            return
        ids = np.fromiter(self._counts, dtype=np.intp, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        factors = penalty_factors(counts, self._frequency, self._presence)
        seen = logits[ids]
        logits[ids] = np.where(seen > 0, seen / factors, seen * factors)


class Picking:
    """One generation's way from a logits row to its next token, on the serial path
    (context.Context.pick) and on a row of the batch (batch.Rows) alike: the penalties, the
    logit bias, then the grammar's mask are written into the row the sampler reads; the
    token's log-probabilities (engines/logprobs.py) are read off that row when asked for;
    the guide then advances by the token picked."""

    def __init__(self, params: SamplingParams, seed: int | None, guide: Mask | None) -> None:
        self.sampler = sampler(params, seed)
        self.guide = guide
        self._penalties: Penalties | None = None
        if not is_no_op_penalty(params.frequency_penalty, params.presence_penalty):
            self._penalties = Penalties(params.frequency_penalty, params.presence_penalty)
        self._bias: LogitBias | None = logit_bias(params.logit_bias)
        self._logprobs = None if params.logprobs is None else Reporter(params.logprobs)
        self._writes = self._penalties is not None or guide is not None or self._bias is not None

    def took(self, token_id: int) -> None:
        """`token_id` was generated (and is fed now): the penalties count it."""
        if self._penalties is not None:
            self._penalties.add(token_id)

    def pick(self, logits: Logits, index: int, vocab: Any) -> Token:
        """The token after the batch's `index`th logits row (-1: the last)."""
        row = logits.row(index) if self._writes or self._logprobs is not None else None
        if self._writes and row is not None:
            if self._penalties is not None:
                self._penalties.apply(row)
            if self._bias is not None:
                self._bias.apply(row)
            if self.guide is not None:
                self.guide.mask_row(row)
        token_id = self.sampler.pick(logits, index)
        logprobs: Logprobs | None = None
        if row is not None and self._logprobs is not None:
            logprobs = self._logprobs.report(row, token_id)
        if self.guide is not None:
            self.guide.advance(token_id)
        eos = bool(llama_cpp.llama_vocab_is_eog(vocab, token_id))
        return Token(token_id=token_id, eos=eos, logprobs=logprobs)

    def close(self) -> None:
        self.sampler.close()


class Logits:
    """A llama.cpp context's logits rows, as numpy views of llama.cpp's own buffer.

    A view is made once per row address and kept: making one (a ctypes array,
    then numpy's buffer protocol) costs more than an argmax over the row.
    A row is always looked up by the address llama.cpp gives now, so a buffer
    llama.cpp has since reallocated is never read through an old view.
    """

    def __init__(self, ctx: Any, n_vocab: int) -> None:
        self.ctx = ctx
        self._n_vocab = n_vocab
        self._row_type = ctypes.c_float * n_vocab
        self._views: dict[int, npt.NDArray[np.float32]] = {}

    def rows(self, n: int) -> npt.NDArray[np.float32]:
        """The last batch's `n` logits rows ([n, vocab]), when each of its `n` tokens kept
        its logits; a view of llama.cpp's buffer, valid until the next decode."""
        pointer = llama_cpp.llama_get_logits(self.ctx)
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if not address:
            raise RuntimeError("llama.cpp holds no logits")
        block = (ctypes.c_float * (n * self._n_vocab)).from_address(address)
        return np.frombuffer(memoryview(block), dtype=np.float32).reshape(n, self._n_vocab)

    def row(self, index: int) -> npt.NDArray[np.float32]:
        """The batch's `index`th row (-1: the last): what is written to it, a pick reads."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if not address:
            raise RuntimeError(f"llama.cpp holds no logits at batch index {index}")
        view = self._views.get(address)
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            row = self._row_type.from_address(address)
            view = self._views[address] = np.frombuffer(memoryview(row), dtype=np.float32)
        return view
