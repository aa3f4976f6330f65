"""Log-probabilities and the logit bias over logits rows, computed the same way on both engines.

What a position reports (`Logprobs`) is the log-softmax of its row as the pick
reads it: after steering, the repetition penalty, the logit bias and a
grammar's mask; before temperature, top_k and top_p (docs/DECISIONS.md,
"Token log-probabilities"). A prompt position's row is the model's own:
nothing is picked there.

A picked token's row (`of_row`, `LogitBias`) is a float32 numpy row: llama.cpp's
own logits buffer, or a transformers logits tensor's `.numpy()` view (no
copy). It is worked in numpy, on the engine's thread alone: a torch op on a
row of the vocabulary's size runs on torch's thread team, whose threads then
spin for a while on the cores llama.cpp's next decode needs (BENCHMARKS.md
measured the llama.cpp decode 14% slower with torch here). The log-sum-exp
runs in float32 over the row less its maximum (one pass of `exp` over the
vocabulary, the one cost that grows with it); the best `k` are found among
the tokens near the maximum first, and over the whole row only when fewer than
`k` are near it. A token at -inf (masked, banned) is never among the best
reported. A prefill's rows (`of_rows`, echo) and scoring (`scored`) are one
call per request, in torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from .base import Logprobs, NonFiniteLogits, Scored, ScoreQuery

Row = npt.NDArray[np.float32]
BAN = -100.0  # a bias at or below bans the token
ONLY = 100.0  # a bias at or above allows only the tokens biased so
NEAR = (4.0, 16.0)  # how far below the maximum the best k are looked for first


class LogitBias:
    """A request's `logit_bias`: each (id, value) adds `value` to that token's logit. At the
    ends it is OpenAI's "ban or exclusive selection": -100 bans the token, and when any token
    is biased +100, only those tokens can be picked (their logits kept, every other at
    -inf). Applied in place, after the penalties and before a grammar's mask."""

    def __init__(self, pairs: Sequence[tuple[int, float]]) -> None:
        added = [(i, v) for i, v in pairs if BAN < v < ONLY and v != 0]
        self._ids = np.array([i for i, _ in added], dtype=np.intp)
        self._values = np.array([v for _, v in added], dtype=np.float32)
        self._banned = np.array([i for i, v in pairs if v <= BAN], dtype=np.intp)
        self._only = np.array([i for i, v in pairs if v >= ONLY], dtype=np.intp)

    @property
    def banned(self) -> tuple[int, ...] | None:
        """The ids it bans when banning is all it does (`ignore_eos` is such a bias), else
        None: a greedy pick under it is an argmax with those ids at -inf, on any device."""
        if self._ids.size or self._only.size:
            return None
        return tuple(int(i) for i in self._banned)

    def apply(self, row: Row) -> None:
        """Bias `row` (one float32 row over the vocabulary) in place."""
        if self._ids.size:
            row[self._ids] += self._values  # the ids are a dict's keys: each once
        if self._only.size:
            kept = row[self._only]
            row.fill(-np.inf)
            row[self._only] = kept
        if self._banned.size:
            row[self._banned] = -np.inf


def logit_bias(pairs: Sequence[tuple[int, float]]) -> LogitBias | None:
    """The bias of `pairs`; None when it changes nothing."""
    return LogitBias(pairs) if any(v != 0 for _, v in pairs) else None


class Reporter:
    """One generation's picked tokens' log-probabilities with their `k` best (`of_row`),
    through one scratch row made once: a row of the vocabulary's size allocated a token
    would come and go through the allocator at every step."""

    def __init__(self, k: int) -> None:
        self._k = k
        self._scratch: Row | None = None

    def report(self, row: Row, token_id: int) -> Logprobs:
        scratch = self._scratch
        if scratch is None or scratch.shape != row.shape:
            scratch = self._scratch = np.empty_like(row)
        return of_row(row, token_id, self._k, scratch)


def of_row(row: Row, token_id: int, k: int, scratch: Row | None = None) -> Logprobs:
    """`token_id`'s log-probability in `row` and the row's `k` best (k >= 0); `scratch`, a
    row of the same shape to work in (else one is made)."""
    high = float(row.max())
    if high != high or high == float("inf"):
        raise NonFiniteLogits("NaN or +inf logits where a token was picked")
    shifted = np.subtract(row, np.float32(high), out=scratch)
    np.exp(shifted, out=shifted)  # one pass, in place: the sum is at least 1 (the maximum's)
    lse = high + float(np.log(shifted.sum()))
    return Logprobs(float(row[token_id]) - lse, _best(row, high, lse, k))


def of_rows(rows: torch.Tensor, next_ids: Sequence[int], k: int) -> list[Logprobs]:
    """Row i's log-probability of `next_ids[i]` and its `k` best, for each row of `rows`
    ([n, vocab]: a prefill's positions, each scoring the next prompt token)."""
    if not len(next_ids):
        return []
    if bool(torch.isnan(rows).any()) or bool(torch.isposinf(rows).any()):
        raise NonFiniteLogits("NaN or +inf logits in the prompt's rows")
    lse = torch.logsumexp(rows, dim=-1)
    ids = torch.tensor(list(next_ids), dtype=torch.long, device=rows.device)
    own = (rows.gather(1, ids[:, None])[:, 0] - lse).tolist()
    if k <= 0:
        return [Logprobs(lp) for lp in own]
    top = torch.topk(rows, min(k, rows.shape[-1]), dim=-1)
    values = (top.values - lse[:, None]).tolist()
    indices = top.indices.tolist()
    out = []
    for lp, vs, js in zip(own, values, indices, strict=True):
        best = tuple((j, v) for j, v in zip(js, vs, strict=True) if v != float("-inf"))
        out.append(Logprobs(lp, best))
    return out


def _best(row: Row, high: float, lse: float, k: int) -> tuple[tuple[int, float], ...]:
    """The `k` best of `row` (highest first, ties by id), as (id, log-probability)."""
    if k <= 0:
        return ()
    ids = None
    for gap in NEAR:
        near = np.flatnonzero(row >= np.float32(high - gap))
        if near.size >= k:
            ids = near
            break
    if ids is None:
        ids = np.argpartition(row, -k)[-k:] if k < row.size else np.arange(row.size)
    values = row[ids]
    order = np.lexsort((ids, -values))[:k]  # by value, highest first; then by id
    return tuple((int(ids[o]), float(values[o]) - lse) for o in order if values[o] != -np.inf)


def scored(logits: torch.Tensor, query: ScoreQuery) -> Scored:
    """Next-token scoring (OAI-SCORE): the best candidate and the `query.alternatives` best,
    by log-probability, of the last position's `logits`.

    - temperature > 0 divides the logits; 0 leaves them as they are;
    - with `allowed`, only those ids are candidates and log_softmax runs over
      them alone (so their probabilities sum to 1);
    - NaN or +inf among the candidates, or -inf on a reported token, raise
      NonFiniteLogits; -inf outside the candidates is fine (masked padding).
    """
    if query.temperature > 0:
        logits = logits / query.temperature
    if query.allowed is not None:
        ids = torch.tensor(query.allowed, dtype=torch.long, device=logits.device)
        candidates = logits[ids]
    else:
        ids = None
        candidates = logits
    if torch.isnan(candidates).any() or torch.isposinf(candidates).any():
        raise NonFiniteLogits("NaN or +inf logits among the candidate tokens")
    logprobs = torch.log_softmax(candidates.double(), dim=-1)
    count = min(max(query.alternatives, 1), candidates.numel())
    top = torch.topk(logprobs, count)
    positions = top.indices.tolist()
    reported = positions if query.alternatives > 0 else positions[:1]
    if any(torch.isneginf(candidates[p]) for p in reported):
        raise NonFiniteLogits("a reported token has a -inf logit")
    values = top.values.tolist()
    pairs = [(_id(ids, p), float(v)) for p, v in zip(positions, values, strict=True)]
    return Scored(best=pairs[0], alternatives=tuple(pairs[: query.alternatives]))


def _id(ids: torch.Tensor | None, position: int) -> int:
    return position if ids is None else int(ids[position])
