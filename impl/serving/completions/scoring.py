"""Scoring mode: next-token log-probabilities instead of text (OAI-SCORE, OAI-CSCORE).

A `/v1/completions` request with `logprobs` or `allowed_token_ids`, or a
chat request with `logprobs: true` or `allowed_token_ids`, is a scoring
request. `scoring_ask` checks its cross-field rules (max_tokens 1, n 1, no
stream, no temperature in (0, 0.001), no steering or structured-output
field) before any model load; a broken rule is `400 invalid_parameter`
naming the field (docs/DECISIONS.md, statuses), while `invalid_scoring_request` is
kept for an id outside the vocabulary and a prompt of no tokens
(OAI-ERR-16); `ScoringReply` shapes the engine's `Scored`
results the way OpenAI legacy completions / chat completions and vLLM do.

Token keys: by default a token is keyed by its decoded text (special tokens
included); two ids that decode to the same text share one entry, whose
log-probability is the log of their summed probabilities (so a normalised
`allowed_token_ids` set still sums to 1). `return_tokens_as_token_ids`
keys by `token_id:<id>` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ...engines.base import Scored, ScoreQuery
from ...errors import ApiError, FieldNotHonoured, InvalidParameter

MIN_TEMPERATURE = 0.001
UNSTEERED_FIELDS = ("profile", "steering_intensity", "steering", "response_format", "tools")
UNUSED_FIELDS = (
    "top_p",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "stream_options",
)  # no effect on one scored token (OAI-SCORE-14), so reported as unused
# `seed` is not among them: it is accepted and echoed, and changes nothing (OAI-SEED-10).


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoringAsk:
    """The scoring fields of one request."""

    logprobs: bool  # report log-probabilities (else: constrain only, `logprobs: null`)
    alternatives: int  # how many alternatives were asked for (0-20)
    allowed: tuple[int, ...] | None
    as_ids: bool
    precision: str | None  # `scoring_precision` as sent (None: not sent)

    def query(self, endpoint: str, temperature: float) -> ScoreQuery:
        """Completions report every allowed id (OAI-SCORE-05); chat min(top_logprobs, set)."""
        count = self.alternatives
        if endpoint == "completions" and self.allowed is not None:
            count = max(count, len(self.allowed))
        allowed = None if self.allowed is None else tuple(dict.fromkeys(self.allowed))
        return ScoreQuery(
            temperature, allowed, count if self.logprobs else 0, self.precision or "native"
        )


def _outside(param: str, message: str) -> ApiError:
    """An id outside the vocabulary (OAI-SCORE-19)."""
    return ApiError("invalid_scoring_request", message, param)


def scoring_ask(endpoint: str, raw: Any) -> ScoringAsk | None:
    """The request's scoring fields, or None for a generation request.

    The mode's cross-field rules (`check_mode`) run after the field policy,
    so a GGUF model refuses the fields themselves first.
    """
    allowed = raw.allowed_token_ids
    if endpoint == "chat":
        wants = raw.logprobs is True
        alternatives = raw.top_logprobs or 0
    else:  # an integer, not `false` (docs/DECISIONS.md, scoring mode)
        count = getattr(raw.logprobs, "root", raw.logprobs)
        wants = isinstance(count, int) and not isinstance(count, bool)
        alternatives = count if wants else 0
    if not wants and allowed is None:
        return None
    return ScoringAsk(
        logprobs=wants,
        alternatives=alternatives,
        allowed=_allowed(allowed),
        as_ids=bool(raw.return_tokens_as_token_ids),
        precision=raw.scoring_precision,
    )


def unused_fields(sent: Collection[str]) -> list[str]:
    """Fields a scoring request sends (`sent`: those with a value) that scoring does not use."""
    return [name for name in UNUSED_FIELDS if name in sent]


def check_top_logprobs(top_logprobs: int | None, ask: ScoringAsk | None) -> None:
    """Chat's `top_logprobs` needs `logprobs: true` (OAI-CSCORE-08); after the field policy."""
    if top_logprobs is not None and not (ask is not None and ask.logprobs):
        raise InvalidParameter("top_logprobs", "top_logprobs needs logprobs: true.")


def check_mode(
    sent: Collection[str], *, max_tokens: int | None, n: int, stream: bool, temperature: float
) -> None:
    """Scoring mode's rules: max_tokens 1, n 1, no stream, a usable temperature, unsteered."""
    if max_tokens != 1:
        raise InvalidParameter(
            "max_tokens",
            "Scoring mode (logprobs or allowed_token_ids) needs max_tokens: 1 "
            f"(got {max_tokens}); nothing is generated, one next token is scored.",
        )
    if n != 1:
        raise InvalidParameter("n", "Scoring mode needs n: 1.")
    if stream:
        raise InvalidParameter("stream", "Scoring mode cannot stream.")
    if 0 < temperature < MIN_TEMPERATURE:
        raise InvalidParameter(
            "temperature",
            f"A scoring temperature must be 0 or at least {MIN_TEMPERATURE} "
            f"(got {temperature}, which would overflow the logits).",
        )
    for name in UNSTEERED_FIELDS:
        if name in sent:
            raise FieldNotHonoured(name, "on scoring requests (scoring is always unsteered)")


def _allowed(ids: Sequence[int] | None) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not ids:
        raise InvalidParameter("allowed_token_ids", "allowed_token_ids is empty.")
    for i, token_id in enumerate(ids):
        if token_id < 0:
            raise _outside(
                f"allowed_token_ids[{i}]",
                f"Token id {token_id} is not in the model's vocabulary.",
            )
    return tuple(ids)


def check_vocabulary(ask: ScoringAsk, vocab_size: int) -> None:
    """Refuse ids outside the loaded model's vocabulary (OAI-SCORE-19)."""
    for i, token_id in enumerate(ask.allowed or ()):
        if token_id >= vocab_size:
            raise _outside(
                f"allowed_token_ids[{i}]",
                f"Token id {token_id} is outside the model's vocabulary (0..{vocab_size - 1}).",
            )


def _merged(pairs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Entries keyed by text; equal keys share one entry (log of summed probabilities)."""
    merged: dict[str, float] = {}
    for key, logprob in pairs:
        merged[key] = logprob if key not in merged else _logaddexp(merged[key], logprob)
    return merged


def _logaddexp(a: float, b: float) -> float:
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


@dataclass(frozen=True, slots=True)
class ScoringReply:
    """Shapes one request's scored prompts as OpenAI choices."""

    endpoint: str
    ask: ScoringAsk
    token_text: Callable[[int], str]

    def key(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.ask.as_ids else self.token_text(token_id)

    def choice(self, index: int, scored: Scored, prompt_chars: int) -> dict[str, Any]:
        best_id, best_lp = scored.best
        text = self.token_text(best_id)
        if self.endpoint == "chat":
            return {
                "index": index,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": self._chat_logprobs(scored) if self.ask.logprobs else None,
                "finish_reason": "length",
            }
        logprobs = None
        if self.ask.logprobs:
            alternatives = [(self.key(i), lp) for i, lp in scored.alternatives]
            logprobs = {
                "tokens": [self.key(best_id)],
                "token_logprobs": [best_lp],
                "top_logprobs": [_merged(alternatives)],
                "text_offset": [prompt_chars],
            }
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": "length"}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self.key(token_id),
            "logprob": logprob,
            "bytes": list(self.token_text(token_id).encode("utf-8")),
        }

    def _chat_logprobs(self, scored: Scored) -> dict[str, Any]:
        merged = _merged([(self.key(i), lp) for i, lp in scored.alternatives])
        top: list[dict[str, Any]] = []
        for token_id, _ in scored.alternatives:  # one entry per key, at its best id
            key = self.key(token_id)
            if all(entry["token"] != key for entry in top):
                top.append(self._entry(token_id, merged[key]))
        return {"content": [{**self._entry(*scored.best), "top_logprobs": top}], "refusal": None}
