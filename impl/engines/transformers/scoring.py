"""Next-token scoring: one forward pass, log-probabilities, and the non-finite rules.

No steering hook runs (scoring is never steered: OAI-SCORE-33): hooks exist only inside a
generation's `steered()` block. `score_kept` runs what the engine's kept KV (or its prompt
cache) does not hold of an unsteered prefix of the prompt (issue 43: an evaluation sends
the same few-shot context thousands of times) and keeps the cache for the next request;
the last position's logits become the reported distribution (`logprobs.scored`).
`score_pass` runs the whole prompt once with no cache: with `ScoreQuery.prompt_logprobs`
(echo), every position's logits are kept and each prompt token after the first gets its
own (`logprobs.of_rows`), from the same pass; a capture reads every position; a float32
copy keeps no cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from ..base import Scored, ScoreQuery
from ..logprobs import of_rows, scored
from .prefix import PrefixCache


def score_kept(
    model: PreTrainedModel,
    prefix: PrefixCache,
    prompt_ids: Sequence[int],
    query: ScoreQuery,
    keeps_last: bool,
) -> Scored:
    """The scored next token after `prompt_ids`, on the engine's kept KV (issue 43): the
    longest unsteered prefix it holds, or its prompt cache stores, is reused and only the
    rest runs; the cache is kept for the next request, as a generation's is."""
    extra = {"logits_to_keep": 1} if keeps_last else {}
    held, cached = prefix.take(prompt_ids, reuse=True, key=())
    try:
        with torch.inference_mode():
            logits = held.feed(model, list(prompt_ids[cached:]), extra).float()
    finally:
        prefix.give_back(held)
    return replace(scored(logits, query), cached_tokens=cached)


def score_pass(
    model: PreTrainedModel, prompt_ids: Sequence[int], query: ScoreQuery, keeps_last: bool
) -> Scored:
    """The scored next token after `prompt_ids` (and, with echo, the prompt's own)."""
    echo = query.prompt_logprobs is not None
    extra = {"logits_to_keep": 1} if keeps_last and not echo else {}
    with torch.inference_mode():
        ids = torch.tensor([list(prompt_ids)], device=model.device)
        out = model(input_ids=ids, use_cache=False, **extra)
    rows: torch.Tensor = out.logits[0].float()
    result = scored(rows[-1], query)
    if query.prompt_logprobs is None:
        return result
    prompt = of_rows(rows[:-1], prompt_ids[1:], query.prompt_logprobs)
    return replace(result, prompt=tuple(prompt))
