"""Embeddings on transformers: the last hidden layer, pooled over every real token.

Inputs are sorted by length and run in batches (right-padded, with an
attention mask, so no real token attends to padding: a causal model only
looks left, an encoder is masked), and each vector is pooled over the real
tokens only: `mean` averages them, `last` takes the last, `cls` the first
(OAI-EMB-12; special tokens the tokenizer added are real tokens). The
base model runs without its LM head, and no steering hook is ever installed
here: hooks live only in a generation's `steered()` block (OAI-EMB-35).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

BATCH_TOKENS = 8192  # padded tokens per forward pass
POOLINGS = ("mean", "last", "cls")


def _batches(lengths: Sequence[int]) -> list[list[int]]:
    """Input indices grouped by similar length, each group within BATCH_TOKENS padded."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= BATCH_TOKENS:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def embed(
    model: PreTrainedModel, inputs: Sequence[Sequence[int]], pooling: str, pad_id: int
) -> np.ndarray:
    """Pooled last-layer vectors [len(inputs), hidden], float32, in input order."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}")
    base = model.base_model
    width = int(model.config.hidden_size)
    out = np.empty((len(inputs), width), dtype=np.float32)
    for group in _batches([len(ids) for ids in inputs]):
        longest = max(len(inputs[i]) for i in group)
        ids = torch.full((len(group), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), longest), dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, : len(inputs[i])] = torch.tensor(list(inputs[i]), dtype=torch.long)
            mask[row, : len(inputs[i])] = 1
        with torch.inference_mode():
            device = model.device
            hidden = base(input_ids=ids.to(device), attention_mask=mask.to(device))
            hidden = hidden.last_hidden_state.float()
        for row, i in enumerate(group):
            n = len(inputs[i])
            if pooling == "mean":
                vector = hidden[row, :n].mean(dim=0)
            elif pooling == "last":
                vector = hidden[row, n - 1]
            else:
                vector = hidden[row, 0]
            out[i] = vector.cpu().numpy()  # pooled on the model's device, one row copied
    return out
