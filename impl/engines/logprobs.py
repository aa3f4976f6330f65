"""Log-probabilities and the logit bias over logits rows, computed the same way on both engines.

Rows are float32 CPU tensors: the transformers engine's logits, or llama.cpp's
own logits buffer seen through `torch.from_numpy` (no copy). What a position
reports (`Logprobs`) is the log-softmax of its row as the pick reads it: after
steering, the repetition penalty, the logit bias and a grammar's mask; before
temperature, top_k and top_p (docs/DECISIONS.md, "Token log-probabilities").
A prompt position's row is the model's own: nothing is picked there.

The log-sum-exp runs in float32 over the row less its maximum (a pass of
`exp` over the vocabulary, the one cost that grows with it); the best `k` are
found among the tokens near the maximum first, and over the whole row only
when fewer than `k` are near it, so a per-token report costs a few tens of
microseconds on a 49k vocabulary (BENCHMARKS.md). A token at -inf (masked,
banned) is never among the best reported.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Logprobs, NonFiniteLogits, Scored, ScoreQuery

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
        self._ids = torch.tensor([i for i, _ in added], dtype=torch.long)
        self._values = torch.tensor([v for _, v in added], dtype=torch.float32)
        self._banned = torch.tensor([i for i, v in pairs if v <= BAN], dtype=torch.long)
        self._only = torch.tensor([i for i, v in pairs if v >= ONLY], dtype=torch.long)

    def apply(self, row: torch.Tensor) -> None:
        """Bias `row` (one float32 row over the vocabulary) in place."""
        if self._ids.numel():
            row.index_add_(0, self._ids, self._values)
        if self._only.numel():
            kept = row.index_select(0, self._only)
            row.fill_(float("-inf"))
            row.index_copy_(0, self._only, kept)
        if self._banned.numel():
            row.index_fill_(0, self._banned, float("-inf"))


def logit_bias(pairs: Sequence[tuple[int, float]]) -> LogitBias | None:
    """The bias of `pairs`; None when it changes nothing."""
    return LogitBias(pairs) if any(v != 0 for _, v in pairs) else None


def of_row(row: torch.Tensor, token_id: int, k: int) -> Logprobs:
    """`token_id`'s log-probability in `row` and the row's `k` best (k >= 0)."""
    high = float(row.max())
    if high != high or high == float("inf"):
        raise NonFiniteLogits("NaN or +inf logits where a token was picked")
    lse = high + float(torch.log(torch.exp(row - high).sum()))
    return Logprobs(float(row[token_id]) - lse, _best(row, high, lse, k))


def of_rows(rows: torch.Tensor, next_ids: Sequence[int], k: int) -> list[Logprobs]:
    """Row i's log-probability of `next_ids[i]` and its `k` best, for each row of `rows`
    ([n, vocab]: a prefill's positions, each scoring the next prompt token)."""
    if not len(next_ids):
        return []
    if bool(torch.isnan(rows).any()) or bool(torch.isposinf(rows).any()):
        raise NonFiniteLogits("NaN or +inf logits in the prompt's rows")
    lse = torch.logsumexp(rows, dim=-1)
    ids = torch.tensor(list(next_ids), dtype=torch.long)
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


def _best(row: torch.Tensor, high: float, lse: float, k: int) -> tuple[tuple[int, float], ...]:
    """The `k` best of `row` (highest first, ties by id), as (id, log-probability)."""
    if k <= 0:
        return ()
    near = None
    for gap in NEAR:
        found = torch.nonzero(row >= high - gap)[:, 0]
        if found.numel() >= k:
            near = found
            break
    if near is None:
        candidates = torch.topk(row, min(k, row.numel()))
        ids, values = candidates.indices, candidates.values
    else:
        values = row.index_select(0, near)
        order = torch.argsort(values, descending=True, stable=True)[:k]
        ids, values = near[order], values[order]
    return tuple(
        (int(i), float(v) - lse)
        for i, v in zip(ids.tolist(), values.tolist(), strict=True)
        if v != float("-inf")
    )


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
        ids = torch.tensor(query.allowed, dtype=torch.long)
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
