"""The decode loop: one prefill pass, then one pass per new token.

The prompt is run once, less the prefix the engine's kept KV cache already
holds (see `prefix.py`); every later pass feeds only the newest token with
the KV cache the earlier passes filled. Each pass runs under
`torch.inference_mode()`, entered and left around the pass alone, so the
mode never leaks into the caller between yields.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..base import Prefilled, SamplingParams, Token
from .grammar import Guide
from .prefix import PrefixCache
from .sampling import apply_penalties, is_no_op_penalty, pick


@dataclass(frozen=True, slots=True)
class DecodeSettings:
    """What the loop needs to know about the model, fixed at load time."""

    eos_ids: frozenset[int]
    context_length: int
    keeps_last_logits: bool


def decode_settings(model: PreTrainedModel, eos_ids: frozenset[int]) -> DecodeSettings:
    """Settings for `model`: its window and whether it takes `logits_to_keep`."""
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    window = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    return DecodeSettings(eos_ids=eos_ids, context_length=window, keeps_last_logits=keeps)


class Counts:
    """How often each token was generated, as tensors for `apply_penalties`."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def add(self, token_id: int) -> None:
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def penalize(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if not self._counts:
            return logits
        ids = torch.tensor(list(self._counts), dtype=torch.long)
        counts = torch.tensor(list(self._counts.values()), dtype=torch.float32)
        return apply_penalties(
            logits,
            ids,
            counts,
            frequency=params.frequency_penalty,
            presence=params.presence_penalty,
        )


class Sampler:
    """One request's step from a pass's logits to its next token id."""

    def __init__(
        self, params: SamplingParams, rng: torch.Generator | None, guide: Guide | None
    ) -> None:
        self.counts = Counts()
        self._params = params
        self._rng = rng
        self._guide = guide
        self._penalized = not is_no_op_penalty(params.frequency_penalty, params.presence_penalty)

    def next_id(self, logits: torch.Tensor) -> int:
        """Apply the penalties, then the grammar's mask, then pick (temperature, top_p, top_k)."""
        if self._penalized:
            logits = self.counts.penalize(logits, self._params)
        if self._guide is not None:
            logits = self._guide.mask(logits)
        return pick(
            logits,
            temperature=self._params.temperature,
            top_p=self._params.top_p,
            rng=self._rng,
            top_k=self._params.top_k,
        )


def decode(
    model: PreTrainedModel,
    settings: DecodeSettings,
    prefix: PrefixCache,
    prompt_ids: Sequence[int],
    *,
    params: SamplingParams,
    rng: torch.Generator | None,
    key: Hashable = (),
    guide: Guide | None = None,
    reuse: bool = True,
) -> Generator[Prefilled | Token, None, None]:
    """Yield up to `params.max_tokens` tokens; stop after an EOS.

    With a `guide`, every token its grammar forbids is masked before sampling
    (after the penalties, before temperature and top_p), and the guide
    advances by each token sampled.

    The cache comes from `prefix` when the generator starts and goes back to
    it when the generator finishes, also when closed: closing raises
    GeneratorExit at the pending `yield`, so no further pass runs. A seeded
    request (`rng` given) reuses nothing, nor does one with `reuse` false
    (a capture must see every prompt position run).
    """
    if not prompt_ids:
        raise ValueError("the prompt holds no tokens")
    budget = _budget(settings, len(prompt_ids), params.max_tokens)
    sampler = Sampler(params, rng, guide)
    extra: dict[str, Any] = {"logits_to_keep": 1} if settings.keeps_last_logits else {}
    held, cached = prefix.take(prompt_ids, reuse=reuse and rng is None, key=key)
    try:
        pending = list(prompt_ids[cached:])
        for step in range(budget):
            with torch.inference_mode():
                token_id = sampler.next_id(held.feed(model, pending, extra).float())
            if guide is not None:
                guide.advance(token_id)
            eos = token_id in settings.eos_ids
            if step == 0:
                yield Prefilled(cached_tokens=cached)
            yield Token(token_id=token_id, eos=eos)
            if eos:
                return
            sampler.counts.add(token_id)
            pending = [token_id]
    finally:
        prefix.give_back(held)


def _budget(settings: DecodeSettings, prompt_length: int, max_tokens: int) -> int:
    """`max_tokens`, cut so the sequence never outgrows the model's window."""
    if settings.context_length <= 0:
        return max_tokens
    return max(0, min(max_tokens, settings.context_length - prompt_length))
