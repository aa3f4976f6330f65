"""Next-token scoring: one forward pass, log-probabilities, and the non-finite rules.

`next_token_logits` runs the prompt once, with no KV cache kept and no
steering hook (scoring is never steered: OAI-SCORE-33): hooks exist only
inside a generation's `steered()` block. `scored` turns the last position's
logits into the reported distribution:

- temperature > 0 divides the logits; 0 leaves them as they are;
- with `allowed`, only those ids are candidates and log_softmax runs over
  them alone (so their probabilities sum to 1);
- NaN or +inf among the candidates, or -inf on a reported token, raise
  NonFiniteLogits; -inf outside the candidates is fine (masked padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ..base import NonFiniteLogits, Scored, ScoreQuery


def next_token_logits(
    model: PreTrainedModel, prompt_ids: Sequence[int], keeps_last: bool
) -> torch.Tensor:
    """The logits [vocab] after `prompt_ids`, in float32."""
    extra = {"logits_to_keep": 1} if keeps_last else {}
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(prompt_ids)]), use_cache=False, **extra)
    logits: torch.Tensor = out.logits[0, -1].float()
    return logits


def scored(logits: torch.Tensor, query: ScoreQuery) -> Scored:
    """The best candidate and the `query.alternatives` best, by log-probability."""
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
