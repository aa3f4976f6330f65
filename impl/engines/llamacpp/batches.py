"""Writing tokens into a `llama_batch`: how both llama.cpp contexts fill theirs.

The serial context (context.py) and the rows' context (batch.py) feed
llama.cpp through batches made once with `llama_batch_init`; `put` writes one
token of one sequence (the rows' prefill puts several prompts' tokens in one
batch), `fill` one prompt's chunk with logits for the prompt's last token
only (or for each of its tokens). A batch is typed `Any`: llama-cpp-python's
ctypes fields (`seq_id` a pointer to pointers) have no types a checker can
follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def put(batch: Any, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    """Token `i` of `batch`: `token` at position `pos` of sequence `seq`, with its logits
    kept when `logits`."""
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits


def fill(
    batch: Any, chunk: Sequence[int], first: int, seq: int, last: int, every: bool = False
) -> None:
    """`batch` holds `chunk` alone, at positions `first`.. of sequence `seq`; logits only
    for position `last` (the prompt's last token) when the chunk holds it, or for every
    position with `every` (a prompt's own log-probabilities)."""
    for j, token in enumerate(chunk):
        put(batch, j, token, first + j, seq, every or first + j == last)
    batch.n_tokens = len(chunk)
