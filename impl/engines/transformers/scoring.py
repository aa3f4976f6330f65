"""Next-token scoring: one forward pass, log-probabilities, and the non-finite rules.

`score_pass` runs the prompt once, with no KV cache kept and no steering hook
(scoring is never steered: OAI-SCORE-33): hooks exist only inside a
generation's `steered()` block. The last position's logits become the
reported distribution (`logprobs.scored`); with `ScoreQuery.prompt_logprobs`
(echo) every position's logits are kept and each prompt token after the first
gets its own (`logprobs.of_rows`), from the same pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from ..base import Scored, ScoreQuery
from ..logprobs import of_rows, scored


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
