"""Constrained decoding on transformers: the shared grammars over a Hugging Face tokenizer.

Compilers, the cache and the mask's bits are engine-neutral (`..grammar`);
here the tokenizer is wrapped for llguidance (about half a second, on the
first constrained request) and the mask is applied to a torch row. The mask
is plain torch: llguidance's own helper is `torch.compile`d and costs
seconds on its first CPU call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerBase

from .. import grammar, thinking
from ..base import Constraint, SamplingParams


class Guide(grammar.Guide):
    """One choice's grammar state, masking torch logits."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (1-D) with every token the grammar forbids set to -inf."""
        keep = torch.from_numpy(self.allowed(logits.shape[0]))
        return logits.masked_fill(~keep, float("-inf"))


class TorchMask(grammar.Mask, Protocol):
    """A grammar's `Guide` or a thinking `Budget`, on torch logits too."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor: ...


class Budget(thinking.Budget):
    """One choice's thinking budget, masking torch logits."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits`, or (a close token forced) every logit but its own -inf."""
        forced = self.forced()
        if forced is None:
            return logits
        out = torch.full_like(logits, float("-inf"))
        out[forced] = logits[forced]
        return out


def _lltokenizer(
    tokenizer: PreTrainedTokenizerBase, eos_ids: list[int], width: int
) -> llguidance.LLTokenizer:
    return llguidance.hf.from_tokenizer(
        tokenizer,  # type: ignore[arg-type]
        n_vocab=width,
        eos_token=eos_ids,
    )


class Grammars(grammar.Grammars):
    """llguidance over one model's Hugging Face tokenizer (`width`: the logits' length)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: frozenset[int],
        width: int,
        size: int = 64,
    ) -> None:
        make = partial(_lltokenizer, tokenizer, sorted(eos_ids), max(width, len(tokenizer)))
        super().__init__(make, size)

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh grammar state for one choice."""
        return Guide(self.matcher(constraint))

    def mask(
        self, params: SamplingParams, decode: Callable[[Sequence[int]], str]
    ) -> TorchMask | None:
        """One choice's mask: its grammar's, else its thinking budget's, else none."""
        if params.constraint is not None:
            return self.guide(params.constraint)
        return None if params.thinking is None else Budget(params.thinking, decode)
