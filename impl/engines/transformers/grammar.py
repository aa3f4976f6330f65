"""Constrained decoding on transformers: the shared grammars over a Hugging Face tokenizer.

Compilers, the cache and the mask's bits are engine-neutral (`..grammar`);
here the tokenizer is wrapped for llguidance (about half a second, on the
first constrained request) and the mask is applied to a torch row. The mask
is plain torch: llguidance's own helper is `torch.compile`d and costs
seconds on its first CPU call.
"""

from __future__ import annotations

from functools import partial

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerBase

from .. import grammar
from ..base import Constraint


class Guide(grammar.Guide):
    """One choice's grammar state, masking torch logits."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (1-D) with every token the grammar forbids set to -inf."""
        keep = torch.from_numpy(self.allowed(logits.shape[0]))
        return logits.masked_fill(~keep, float("-inf"))


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
