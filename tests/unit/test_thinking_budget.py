"""A thinking budget's state for one choice (engines/thinking.py), over a toy vocabulary."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from miserver.engines.base import ThinkingBudget
from miserver.engines.thinking import Budget, Phase

VOCAB = ["<think>", "</", "think", ">", "a", "b", " ", "</think>", "<"]
CLOSE_IDS = (1, 2, 3)  # "</" "think" ">", as the toy tokenizer writes the close


def decode(ids: Sequence[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def budget(tokens: int, *, inside: bool = True) -> Budget:
    return Budget(ThinkingBudget(tokens, "<think>", "</think>", CLOSE_IDS, inside), decode)


def forced_run(state: Budget, picks: Sequence[int]) -> list[int]:
    """The ids a reply gets when it would pick `picks` in turn: a forced token replaces the
    pick (the mask leaves only it), and the picks go on after the close."""
    out, queue = [], list(picks)
    while queue:
        row = np.zeros(len(VOCAB), dtype=np.float32)
        state.mask_row(row)
        allowed = np.flatnonzero(row > -np.inf)
        pick = queue.pop(0)
        token = int(allowed[0]) if len(allowed) == 1 else pick
        state.advance(token)
        out.append(token)
    return out


def test_the_close_is_forced_once_the_budget_is_spent() -> None:
    """Issue 45 item 1 (thinking.budget_tokens): three tokens inside the span, then its close
    forced token by token, then the reply goes on free."""
    state = budget(3)
    ids = forced_run(state, [4, 5, 4, 5, 5, 5, 4, 4])
    assert decode(ids) == "aba</think>aa"  # the close took the place of three picks
    assert state.phase is Phase.AFTER


@pytest.mark.parametrize("close", [[7], [1, 2, 3], [8, 1, 2, 3]], ids=["one", "split", "late"])
def test_a_span_closed_in_time_is_left_alone(close: list[int]) -> None:
    """A close the model writes within the budget, however its tokens split it, ends the
    span: nothing is forced after it."""
    state = budget(12)
    ids = forced_run(state, [4, *close, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5])
    assert ids == [4, *close, *[5] * 12] and state.phase is Phase.AFTER


def test_a_reply_that_opens_the_span_itself() -> None:
    """When the prompt did not open the span, the budget counts from the reply's own open
    (leading whitespace first); a reply that starts otherwise has none."""
    state = budget(2, inside=False)
    ids = forced_run(state, [6, 0, 4, 4, 4, 4, 4, 5])
    assert decode(ids) == " <think>aa</think>b"
    plain = budget(2, inside=False)
    assert forced_run(plain, [4, 4, 4, 4]) == [4, 4, 4, 4] and plain.phase is Phase.AFTER
    waiting = budget(2, inside=False)
    forced_run(waiting, [8])  # "<" may yet be the open
    assert waiting.phase is Phase.BEFORE


def test_a_zero_budget_closes_at_once() -> None:
    assert decode(forced_run(budget(0), [4, 4, 4, 5])) == "</think>b"
