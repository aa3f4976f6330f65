"""Scoring mode: next-token log-probabilities instead of text (OAI-SCORE, OAI-CSCORE).

A request that sends `allowed_token_ids`, or asks for `logprobs` (completions:
an integer; chat: `logprobs: true`) with `max_tokens: 1`, is a scoring
request (`scoring_ask`; any other request with `logprobs` generates and
reports its tokens', docs/DECISIONS.md "Token log-probabilities"). `check_mode`
checks its cross-field rules (max_tokens 1, n 1, no stream, no temperature in
(0, 0.001), no steering or structured-output field) before any model load; a
broken rule is `400 invalid_parameter` naming the field (docs/DECISIONS.md,
statuses), while `invalid_scoring_request` is kept for an id outside the
vocabulary and a prompt of no tokens (OAI-ERR-16). `ScoringReply` shapes the
engine's `Scored` results the way OpenAI legacy completions / chat
completions and vLLM do (logprobs.py), the prompt's own first with `echo`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ...engines.base import Logprobs, Scored, ScoreQuery
from ...errors import ApiError, FieldNotHonoured, InvalidParameter
from .logprobs import Shaper, TokenLogprob, joined, prompt_entries

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
    echo: bool = False  # completions' `echo`: the prompt's text (and logprobs) first

    def query(self, endpoint: str, temperature: float) -> ScoreQuery:
        """Completions report every allowed id (OAI-SCORE-05); chat min(top_logprobs, set)."""
        count = self.alternatives
        if endpoint == "completions" and self.allowed is not None:
            count = max(count, len(self.allowed))
        allowed = None if self.allowed is None else tuple(dict.fromkeys(self.allowed))
        echo = self.alternatives if self.echo and self.logprobs else None
        return ScoreQuery(
            temperature,
            allowed,
            count if self.logprobs else 0,
            self.precision or "native",
            prompt_logprobs=echo,
        )


def _outside(param: str, message: str) -> ApiError:
    """An id outside the vocabulary (OAI-SCORE-19)."""
    return ApiError("invalid_scoring_request", message, param)


def logprobs_asked(endpoint: str, raw: Any) -> int | None:
    """How many alternatives a request's `logprobs` asks for per token; None when it asks
    for none (chat: `logprobs: true` with `top_logprobs`, else 0; completions: an integer,
    not `false`, docs/DECISIONS.md, scoring mode)."""
    if endpoint == "chat":
        return (raw.top_logprobs or 0) if raw.logprobs is True else None
    count = getattr(raw.logprobs, "root", raw.logprobs)
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def scoring_ask(endpoint: str, raw: Any, max_tokens: int | None) -> ScoringAsk | None:
    """The request's scoring fields, or None for a generation request.

    The rule (docs/DECISIONS.md, "Token log-probabilities"): a request is a
    scoring request when it sends `allowed_token_ids`, or asks for `logprobs`
    with `max_tokens` (or `max_completion_tokens`) 1. Any other request with
    `logprobs` generates, and reports each generated token's. The mode's
    cross-field rules (`check_mode`) run after the field policy, so an engine
    refuses the fields themselves first.
    """
    allowed = raw.allowed_token_ids
    alternatives = logprobs_asked(endpoint, raw)
    if allowed is None and (alternatives is None or max_tokens != 1):
        return None
    return ScoringAsk(
        logprobs=alternatives is not None,
        alternatives=alternatives or 0,
        allowed=_allowed(allowed),
        as_ids=bool(raw.return_tokens_as_token_ids),
        precision=raw.scoring_precision,
        echo=endpoint == "completions" and raw.echo is True,
    )


def unused_fields(sent: Collection[str]) -> list[str]:
    """Fields a scoring request sends (`sent`: those with a value) that scoring does not use."""
    return [name for name in UNUSED_FIELDS if name in sent]


def check_top_logprobs(top_logprobs: int | None, logprobs: bool) -> None:
    """Chat's `top_logprobs` needs `logprobs: true` (OAI-CSCORE-08); after the field policy."""
    if top_logprobs is not None and not logprobs:
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


@dataclass(frozen=True, slots=True)
class ScoringReply:
    """Shapes one request's scored prompts as OpenAI choices (logprobs.py's `Shaper`)."""

    endpoint: str
    ask: ScoringAsk
    token_text: Callable[[int], str]

    def choice(
        self, index: int, scored: Scored, prompt_text: str, prompt_ids: Sequence[int]
    ) -> dict[str, Any]:
        """Prompt `index`'s choice; with echo, the prompt's text and tokens come first."""
        best_id, best_lp = scored.best
        text = self.token_text(best_id)
        shaper = Shaper(self.endpoint, self.ask.as_ids, self.token_text, len(prompt_text))
        best = [TokenLogprob(best_id, Logprobs(best_lp, scored.alternatives))]
        if self.endpoint == "chat":
            return {
                "index": index,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": shaper.shaped(best) if self.ask.logprobs else None,
                "finish_reason": "length",
            }
        logprobs = None
        if self.ask.echo:
            text = prompt_text + text
            if self.ask.logprobs:
                echoed = prompt_entries(prompt_ids, scored.prompt)
                logprobs = shaper.echoed(echoed, prompt_text)
        if self.ask.logprobs:
            logprobs = joined(logprobs, shaper.shaped(best))
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": "length"}
