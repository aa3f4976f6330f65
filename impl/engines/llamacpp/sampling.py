"""Picking the next token on llama.cpp: its sampler chain plus our penalty.

The chain holds only what the request asks for, so none of llama.cpp's
defaults (top_k 40, min_p 0.05, repeat_penalty 1.1 in some front ends)
alters sampling: `greedy` at temperature 0, else `top_k` (when the config's
`top-k` is above 0), `temp`, then `top_p` (when below 1), then `dist`.
Temperature comes before top_p, as in the transformers engine
(`..transformers.sampling`), so both engines cut the same nucleus.

OpenAI's `frequency_penalty` (f) and `presence_penalty` (p) are mapped to the
same multiplicative repetition penalty as the transformers engine
(OAI-CHAT-24): a token generated `c >= 1` times in this completion (prompt
tokens not counted) gets the factor `exp(p + f * ln(1 + c))`; its logit `l`
becomes `l / factor` when `l > 0`, else `l * factor`. `Penalties` applies it
in place to the context's logits row (`last_logits`) before the chain runs,
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

from ..base import SamplingParams


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


def sampler_chain(params: SamplingParams, seed: int | None = None) -> _internals.LlamaSampler:
    """llama.cpp's sampler chain for `params`: greedy, or [top_k ->] temp -> top_p -> dist
    (`dist` seeded with `seed`, else at random)."""
    chain = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
    if params.temperature == 0:
        chain.add_greedy()  # type: ignore[no-untyped-call]
        return chain
    if params.top_k > 0:
        chain.add_top_k(params.top_k)
    chain.add_temp(params.temperature)
    if params.top_p < 1:
        chain.add_top_p(params.top_p, 1)
    chain.add_dist(llama_cpp.LLAMA_DEFAULT_SEED if seed is None else seed)
    return chain


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


def last_logits(ctx: Any, n_vocab: int) -> npt.NDArray[np.float32]:
    """The last logits row of a llama.cpp context as a numpy view: the chain reads what is
    written to it."""
    row = llama_cpp.llama_get_logits_ith(ctx, -1)
    pointer = ctypes.cast(row, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,))
