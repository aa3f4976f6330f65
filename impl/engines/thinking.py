"""A thinking budget, enforced token by token on every engine (`base.ThinkingBudget`).

One choice's `Budget` follows its reply: before the span (when the prompt did not open it,
the reply may open it with its first text), inside it (each token counted), and after it.
The span ends when the reply writes its close (read off the decoded text of the last few
tokens, however the model split it); once `tokens` are spent inside it, the close is forced,
one token of `close_ids` per step (every other logit -inf), and the reply goes on free. A
reply that does not start with the span's open never had one: nothing is counted.

It masks as a grammar's `Guide` does (`mask_row`, then `advance` by the token picked), and
takes a grammar's place: a reply held to a grammar is rendered with thinking off
(serving/chat/thinking.py), so the two never meet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum

import numpy as np
import numpy.typing as npt

from .base import ThinkingBudget

WINDOW = 8  # tokens past the close's own length that its text is looked for in


class Phase(Enum):
    BEFORE = "before"  # the reply may yet open the span
    INSIDE = "inside"
    AFTER = "after"  # closed, forced closed, or never opened


class Budget:
    """One choice's thinking budget; `decode` is the engine's (ids to text)."""

    def __init__(self, spec: ThinkingBudget, decode: Callable[[Sequence[int]], str]) -> None:
        self._spec = spec
        self._decode = decode
        self._phase = Phase.BEFORE
        self._seen: list[int] = []  # the reply's ids since the span opened (or from its start)
        self._spent = 0
        self._forcing = -1  # the index into close_ids forced next; -1: none
        if spec.inside:
            self._opened()

    @property
    def phase(self) -> Phase:
        return self._phase

    def forced(self) -> int | None:
        """The token the budget forces next, or None."""
        return self._spec.close_ids[self._forcing] if self._forcing >= 0 else None

    def mask_row(self, logits: npt.NDArray[np.float32]) -> None:
        """Every logit but a forced token's set to -inf, in place (one row)."""
        forced = self.forced()
        if forced is not None:
            kept = logits[forced]
            logits[:] = -np.inf
            logits[forced] = kept

    def advance(self, token_id: int) -> None:
        """Follow the token picked."""
        if self._phase is Phase.AFTER:
            return
        if self._forcing >= 0:
            self._forcing += 1
            if self._forcing == len(self._spec.close_ids):
                self._forcing, self._phase = -1, Phase.AFTER
            return
        self._seen.append(token_id)
        if self._phase is Phase.BEFORE:
            self._opening()
            return
        self._spent += 1
        tail = self._seen[-(len(self._spec.close_ids) + WINDOW) :]
        if self._spec.close in self._decode(tail):
            self._phase = Phase.AFTER
        elif self._spent >= self._spec.tokens:
            self._forcing = 0

    def _opened(self) -> None:
        self._phase, self._seen = Phase.INSIDE, []
        if self._spec.tokens <= 0:
            self._forcing = 0

    def _opening(self) -> None:
        """Before the span: open it once the reply's text starts with its open; give up once
        the text cannot."""
        text = self._decode(self._seen).lstrip()
        if text.startswith(self._spec.open):
            self._opened()
        elif text and not self._spec.open.startswith(text):
            self._phase = Phase.AFTER
