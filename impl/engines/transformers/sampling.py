"""Picking the next token from a row of logits: pure torch functions.

The order is: repetition penalty, then temperature (0 means greedy argmax),
then top_k (the config's `top-k`; 0 is off), then top_p nucleus filtering,
then a draw from the request's generator.

OpenAI's `frequency_penalty` (f) and `presence_penalty` (p), both in
[-2, 2], are mapped to Hugging Face's multiplicative repetition penalty
(`RepetitionPenaltyLogitsProcessor`): a token already generated `c >= 1`
times in this completion gets the factor

    penalty(c) = exp(p + f * ln(1 + c)) = e**p * (1 + c)**f

and its logit `l` becomes `l / penalty` when `l > 0`, else `l * penalty`.
So f and p add in the log domain, as OpenAI's penalties add in the logit
domain; p acts once a token is present, f grows with its count (as a power
of 1 + c, so it stays finite over a whole context window). The factor is
exactly 1 (a no-op) when f == p == 0 and always > 0; it is monotone
increasing in f, in p, and (for f > 0) in c. A factor above 1 discourages a
token, below 1 (negative values) encourages it. Tokens of the prompt are not
counted, as in OpenAI's API: a chat prompt is full of template tokens (the
end-of-turn among them) that a penalty must not push away.
"""

from __future__ import annotations

import torch


def new_rng(seed: int | None) -> torch.Generator | None:
    """A generator seeded with `seed`; None (the global RNG) when no seed."""
    if seed is None:
        return None
    return torch.Generator().manual_seed(seed)


def penalty_factors(counts: torch.Tensor, frequency: float, presence: float) -> torch.Tensor:
    """The repetition penalty for tokens seen `counts` (>= 1) times."""
    return torch.exp(presence + frequency * torch.log1p(counts.to(torch.float32)))


def apply_penalties(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    counts: torch.Tensor,
    *,
    frequency: float,
    presence: float,
) -> torch.Tensor:
    """`logits` (1-D) with the repetition penalty applied to `token_ids`."""
    factors = penalty_factors(counts, frequency, presence).to(logits.dtype)
    seen = logits[token_ids]
    penalized = torch.where(seen > 0, seen / factors, seen * factors)
    return logits.index_put((token_ids,), penalized)


def nucleus(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and token ids of the top_p nucleus, most likely first.

    The nucleus is the smallest set of tokens whose probabilities sum to at
    least `top_p`; it always holds at least the most likely token. The
    probabilities are not renormalized (`torch.multinomial` does not need it).
    """
    probs, ids = torch.sort(torch.softmax(logits, dim=-1), descending=True)
    mass = torch.cumsum(probs, dim=-1)
    keep = 1 + int(torch.count_nonzero(mass[:-1] < top_p))
    return probs[:keep], ids[:keep]


def keep_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """`logits` with every token outside the `top_k` most likely at -inf (0: unchanged)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k).values[-1]
    return logits.masked_fill(logits < threshold, float("-inf"))


def pick(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    rng: torch.Generator | None,
    top_k: int = 0,
) -> int:
    """The next token id: argmax at temperature 0, else a seeded draw."""
    if temperature == 0:
        return int(torch.argmax(logits))
    scaled = keep_top_k(logits, top_k) / temperature
    if top_p >= 1:
        probs = torch.softmax(scaled, dim=-1)
        return int(torch.multinomial(probs, 1, generator=rng))
    probs, ids = nucleus(scaled, top_p)
    return int(ids[torch.multinomial(probs, 1, generator=rng)])


def is_no_op_penalty(frequency: float, presence: float) -> bool:
    """Whether these penalties change nothing (both zero)."""
    return frequency == 0 and presence == 0
