"""How many prompt tokens a step of the batch prefills (engines/rows.py `prefill_limit`):
the load's chunk beside decoding rows, at most a cap for Batch API prompts (issue 50)."""

from __future__ import annotations

import pytest

from miserver.engines.rows import prefill_limit


@pytest.mark.parametrize(
    ("chunk", "decoded", "cap", "limit"),
    [
        (256, False, None, None),  # no row decodes: the whole prompt, nobody waits for it
        (256, False, 16, None),
        (256, True, None, 256),  # beside decoding rows: the load's chunk
        (0, True, None, None),  # `prefill-chunk 0`: whole prompts even then
        (256, True, 16, 16),  # Batch API prompts: at most the cap
        (8, True, 16, 8),  # a smaller chunk stays
        (0, True, 16, 16),
    ],
)
def test_a_step_prefills_the_chunk_capped_for_batch_lines(
    chunk: int, decoded: bool, cap: int | None, limit: int | None
) -> None:
    """Issue 43 (chunked prefill) and issue 50: while rows decode, a step prefills the
    load's chunk of the waiting prompts (0: all of them); when only Batch API prompts wait,
    at most BACKGROUND_CHUNK, so the step an interactive request arrives in is short."""
    assert prefill_limit(chunk, decoded=decoded, cap=cap) == limit
