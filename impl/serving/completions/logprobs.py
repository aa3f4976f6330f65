"""Token log-probabilities in OpenAI's shapes: chat's `logprobs.content`, completions' legacy
object (docs/DECISIONS.md, "Token log-probabilities").

Scoring (one next token, OAI-SCORE) and a generation's tokens (`logprobs` with
any other `max_tokens`, issue 42) are shaped by the same `Shaper`, from
`TokenLogprob`s: a token id and the engine's `Logprobs` at its position (None
for a prompt's first token, which nothing predicts).

- chat: one `{"token", "logprob", "bytes", "top_logprobs"}` per token
  (`bytes` the UTF-8 of its decoded text, OAI-CSCORE-16); the alternatives
  keyed like the token, one entry per key.
- completions: `tokens`, `token_logprobs`, `top_logprobs` (a map per token,
  `null` for the prompt's first: the k best and, when k >= 1 and it is not
  among them, the token itself last, up to k + 1 keys as OpenAI's legacy API
  documents and vLLM answers) and `text_offset`, each token's character
  offset in prompt + completion: the prompt's tokens (echo) count from 0, the
  completion's from the prompt text's length (OAI-SCORE-16); each offset adds
  the previous token's text length, as vLLM counts them.

Keys: a token's decoded text (special tokens included), or `token_id:<id>`
with `return_tokens_as_token_ids`. Two ids that decode to the same text share
one alternative, whose log-probability is the log of their summed
probabilities (OAI-SCORE-18). JSON holds no infinity: a log-probability of
-inf (a token a grammar or a bias all but forbade) is written -9999.0, as
OpenAI writes a negligible one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...engines.base import Logprobs

FLOOR = -9999.0  # what JSON gets for -inf


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One reported token: its id and the log-probabilities at its position (None: a prompt's
    first token)."""

    token_id: int
    logprobs: Logprobs | None


def prompt_entries(ids: Sequence[int], logprobs: Sequence[Logprobs]) -> list[TokenLogprob]:
    """A prompt's tokens with their log-probabilities (echo): the first has none."""
    if not ids:
        return []
    return [TokenLogprob(ids[0], None)] + [
        TokenLogprob(i, lp) for i, lp in zip(ids[1:], logprobs, strict=True)
    ]


@dataclass(slots=True)
class Shaper:
    """Shapes one choice's reported tokens; for completions it counts `text_offset` on from
    where the last piece stopped (`offset`: where the next token's text starts)."""

    endpoint: str
    as_ids: bool
    token_text: Callable[[int], str]
    offset: int = 0
    _texts: dict[int, str] = field(default_factory=dict)

    def text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.token_text(token_id)
        return text

    def key(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.text(token_id)

    def shaped(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """`entries` as the endpoint's `logprobs` object (a chunk's or a whole choice's)."""
        if self.endpoint == "chat":
            return {"content": [self._chat(e) for e in entries], "refusal": None}
        tokens: list[str] = []
        lps: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for entry in entries:
            tokens.append(self.key(entry.token_id))
            offsets.append(self.offset)
            self.offset += len(self.text(entry.token_id))
            if entry.logprobs is None:
                lps.append(None)
                tops.append(None)
            else:
                lps.append(_finite(entry.logprobs.logprob))
                top = self._merged(entry.logprobs.top)
                if top:  # the token itself too, when not among the k best (OpenAI: k + 1)
                    top.setdefault(self.key(entry.token_id), _finite(entry.logprobs.logprob))
                tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def echoed(self, entries: Sequence[TokenLogprob], prompt_text: str) -> dict[str, Any]:
        """A completion's echoed prompt: its tokens' object, offsets from 0; the completion's
        tokens then count from the prompt text's length."""
        self.offset = 0
        shaped = self.shaped(entries)
        self.offset = len(prompt_text)
        return shaped

    def _merged(self, top: Sequence[tuple[int, float]]) -> dict[str, float]:
        """Alternatives keyed by text; equal keys share one entry (log of summed
        probabilities)."""
        merged: dict[str, float] = {}
        for token_id, logprob in top:
            key = self.key(token_id)
            merged[key] = logprob if key not in merged else _logaddexp(merged[key], logprob)
        return {k: _finite(v) for k, v in merged.items()}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self.key(token_id),
            "logprob": _finite(logprob),
            "bytes": list(self.text(token_id).encode("utf-8")),
        }

    def _chat(self, entry: TokenLogprob) -> dict[str, Any]:
        assert entry.logprobs is not None, "a chat reports generated tokens only"
        merged = self._merged(entry.logprobs.top)
        top: list[dict[str, Any]] = []
        for token_id, _ in entry.logprobs.top:  # one entry per key, at its best id
            key = self.key(token_id)
            if all(e["token"] != key for e in top):
                top.append(self._entry(token_id, merged[key]))
        return {**self._entry(entry.token_id, entry.logprobs.logprob), "top_logprobs": top}


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def _logaddexp(a: float, b: float) -> float:
    high, low = max(a, b), min(a, b)
    if low == -math.inf:
        return high
    return high + math.log1p(math.exp(low - high))


def joined(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """Two `logprobs` objects of one choice as one, in order."""
    if first is None:
        return second
    if "content" in first:
        return {**first, "content": [*first["content"], *second["content"]]}
    return {key: [*first[key], *second[key]] for key in first}
