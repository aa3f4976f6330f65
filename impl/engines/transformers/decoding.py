"""The decode loop: one prefill pass, then one pass per new token.

The prompt is run once, less the prefix the engine's kept KV cache already
holds (see `prefix.py`); every later pass feeds only the newest token with
the KV cache the earlier passes filled. Each pass runs under
`torch.inference_mode()`, entered and left around the pass alone, so the
mode never leaks into the caller between yields.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..base import Logprobs, Prefilled, SamplingParams, Token
from ..logprobs import Reporter, logit_bias, of_rows
from .grammar import TorchMask
from .prefix import Held, PrefixCache
from .sampling import apply_penalties, is_no_op_penalty, pick


@dataclass(frozen=True, slots=True)
class DecodeSettings:
    """What the loop needs to know about the model, fixed at load time."""

    eos_ids: frozenset[int]
    context_length: int
    keeps_last_logits: bool


def decode_settings(model: PreTrainedModel, eos_ids: frozenset[int]) -> DecodeSettings:
    """Settings for `model`: its window and whether it takes `logits_to_keep`."""
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    window = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    return DecodeSettings(eos_ids=eos_ids, context_length=window, keeps_last_logits=keeps)


class Counts:
    """How often each token was generated, as tensors for `apply_penalties`."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def add(self, token_id: int) -> None:
        self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def penalize(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if not self._counts:
            return logits
        ids = torch.tensor(list(self._counts), dtype=torch.long)
        counts = torch.tensor(list(self._counts.values()), dtype=torch.float32)
        return apply_penalties(
            logits,
            ids,
            counts,
            frequency=params.frequency_penalty,
            presence=params.presence_penalty,
        )


class Sampler:
    """One request's step from a pass's logits to its next token id (and its logprobs)."""

    def __init__(
        self, params: SamplingParams, rng: torch.Generator | None, guide: TorchMask | None
    ) -> None:
        self.counts = Counts()
        self._params = params
        self._rng = rng
        self._guide = guide
        self._penalized = not is_no_op_penalty(params.frequency_penalty, params.presence_penalty)
        self._bias = logit_bias(params.logit_bias)
        self._reporter = None if params.logprobs is None else Reporter(params.logprobs)
        banned = () if self._bias is None else self._bias.banned
        self.plain = (  # greedy, at most banning ids: an argmax where the logits are
            params.temperature == 0
            and not self._penalized
            and banned is not None
            and guide is None
            and self._reporter is None
        )
        self._banned = tuple(banned or ())
        self._banned_on: dict[torch.device, torch.Tensor] = {}

    @property
    def bans(self) -> bool:
        return bool(self._banned)

    def unbanned(self, logits: torch.Tensor) -> torch.Tensor:
        """A plain pick's logits (one row, or the rows of a batch it owns): with the ids its
        bias bans at -inf, on their device; `logits` itself when it bans none."""
        if not self._banned:
            return logits
        ids = self._banned_on.get(logits.device)
        if ids is None:
            ids = torch.tensor(self._banned, dtype=torch.long, device=logits.device)
            self._banned_on[logits.device] = ids
        return logits.index_fill(-1, ids, float("-inf"))

    def pick(self, logits: torch.Tensor) -> tuple[int, Logprobs | None]:
        """Apply the penalties, the logit bias, then the grammar's mask, then pick (temperature,
        top_p, top_k); the token's log-probabilities when the request asks for them, of the
        logits the pick read (engines/logprobs.py). The guide advances by the token picked;
        `logits` may be written over. A plain greedy pick is an argmax on the logits' device;
        every other reads a host copy (a seeded draw uses a CPU generator, on any device)."""
        if self.plain:
            return int(torch.argmax(self.unbanned(logits))), None
        logits = logits.cpu()
        with torch.inference_mode():
            if self._penalized:
                logits = self.counts.penalize(logits, self._params)
            if self._bias is not None:
                logits = logits.contiguous()
                self._bias.apply(logits.numpy())  # in place, through numpy's view
            if self._guide is not None:
                logits = self._guide.mask(logits)
            token_id = pick(
                logits,
                temperature=self._params.temperature,
                top_p=self._params.top_p,
                rng=self._rng,
                top_k=self._params.top_k,
            )
            reporter = self._reporter
            logprobs = None
            if reporter is not None:
                logprobs = reporter.report(logits.contiguous().numpy(), token_id)
        if self._guide is not None:
            self._guide.advance(token_id)
        return token_id, logprobs


def pick_rows(
    logits: torch.Tensor, samplers: Sequence[Sampler]
) -> list[tuple[int, Logprobs | None]]:
    """Each row's pick from a batch's logits ([rows, vocab], row i for `samplers[i]`): the
    plain greedy rows by one argmax on the device, the others from one host copy."""
    plain = [s.plain for s in samplers]
    greedy: list[int] = []
    if any(plain):
        picked = logits
        if any(s.plain and s.bans for s in samplers):  # ignore_eos: those rows' bans first
            picked = torch.stack([s.unbanned(row) for s, row in zip(samplers, logits, strict=True)])
        greedy = picked.argmax(dim=-1).tolist()
    host = logits if all(plain) else logits.cpu()
    return [
        (greedy[i], None) if plain[i] else sampler.pick(host[i])
        for i, sampler in enumerate(samplers)
    ]


def decode(
    model: PreTrainedModel,
    settings: DecodeSettings,
    prefix: PrefixCache,
    prompt_ids: Sequence[int],
    *,
    params: SamplingParams,
    rng: torch.Generator | None,
    key: Hashable = (),
    guide: TorchMask | None = None,
    reuse: bool = True,
) -> Generator[Prefilled | Token, None, None]:
    """Yield a `Prefilled`, then up to `params.max_tokens` tokens; stop after an EOS.

    A `guide` masks what its grammar forbids (after the penalties and the logit
    bias, before temperature and top_p) and advances by each token. With echo
    (`params.prompt_logprobs`) the whole prompt runs with every position's
    logits, and the `Prefilled` carries the prompt's log-probabilities. The
    cache comes from `prefix` and goes back to it however the generator ends
    (closing it raises GeneratorExit at the pending `yield`: no further pass).
    A seeded request (`rng`), an echo or `reuse` false (a capture) reuses
    nothing.
    """
    if not prompt_ids:
        raise ValueError("the prompt holds no tokens")
    budget = _budget(settings, len(prompt_ids), params.max_tokens)
    sampler = Sampler(params, rng, guide)
    extra: dict[str, Any] = {"logits_to_keep": 1} if settings.keeps_last_logits else {}
    echo = params.prompt_logprobs
    reuse = reuse and rng is None and echo is None
    held, cached = prefix.take(prompt_ids, reuse=reuse, key=key)
    try:
        if budget == 0 and echo is None:
            yield Prefilled(cached_tokens=cached)
            return
        logits, prompt = _prefill(model, held, prompt_ids[cached:], extra, echo)
        yield Prefilled(cached_tokens=cached, prompt_logprobs=prompt)
        token_id = -1
        for step in range(budget):
            if step:  # the token picked last is fed now
                with torch.inference_mode():
                    logits = held.feed(model, [token_id], extra).float()
            token_id, logprobs = sampler.pick(logits)
            eos = token_id in settings.eos_ids
            yield Token(token_id=token_id, eos=eos, logprobs=logprobs)
            if eos:
                return
            sampler.counts.add(token_id)
    finally:
        prefix.give_back(held)


def _prefill(
    model: PreTrainedModel,
    held: Held,
    pending: Sequence[int],
    extra: dict[str, Any],
    echo: int | None,
) -> tuple[torch.Tensor, tuple[Logprobs, ...]]:
    """Run the prompt's `pending` ids: the last position's logits, and with `echo` (the whole
    prompt pending) each prompt token's log-probabilities after the first."""
    with torch.inference_mode():
        if echo is None:
            return held.feed(model, list(pending), extra).float(), ()
        rows = held.feed_all(model, list(pending)).float()
        return rows[-1], tuple(of_rows(rows[:-1], pending[1:], echo))


def _budget(settings: DecodeSettings, prompt_length: int, max_tokens: int) -> int:
    """`max_tokens`, cut so the sequence never outgrows the model's window."""
    if settings.context_length <= 0:
        return max_tokens
    return max(0, min(max_tokens, settings.context_length - prompt_length))
