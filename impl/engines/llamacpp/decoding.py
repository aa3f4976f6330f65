"""The decode loop on llama.cpp: prefill what the cache lacks, then one token per step.

The prompt is run once, less the prefix the context already holds
(`Context.hold`, LOC-CHAT-43); every later step runs only the newest
token. Generation stops after an end-of-generation token (any token in the
vocabulary's EOG set, not only `token_eos`), yielded with `eos=True`, or
after `max_tokens`. Closing the generator raises GeneratorExit at the pending
`yield`, so no further step runs; the context keeps what it holds for the
next request.

A seeded request (`seed` given) prefills in full, reusing nothing, and
samples with a `dist` seeded with `seed`: the same seed, prompt and model
give the same tokens, whatever the cache held before. With a `guide`, every
token its grammar forbids is masked (after the penalties and the logit bias,
before the chain), and the guide advances by each token picked
(`sampling.Picking`). With `prompt_logprobs` (echo) the whole prompt runs
again with every position's logits kept (`Context.hold_scored`), and the
`Prefilled` carries the prompt's log-probabilities; `max_tokens` 0 then
generates nothing. Every forward pass (the prefill and each step) runs under
the hooks' steering, its control vector (steering.py) read at each pass, and
feeds their monitor and capture (tap.py); a generation that reads reuses no
kept prefix, so its rows cover every prompt position, and its capture is
recorded as it ends.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from ..base import NO_HOOKS, Hooks, Logprobs, Prefilled, SamplingParams, Token
from ..grammar import Mask
from .context import Context
from .sampling import Picking
from .tap import Observer


def decode(
    context: Context,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    seed: int | None = None,
    guide: Mask | None = None,
    hooks: Hooks = NO_HOOKS,
) -> Generator[Prefilled | Token, None, None]:
    """Yield one `Prefilled`, then up to `params.max_tokens` tokens; stop after an EOG."""
    sequence = [int(i) for i in prompt_ids]
    if not sequence:
        raise ValueError("the prompt holds no tokens")
    n_vocab = int(context.llama.n_vocab())
    check_ids(sequence, n_vocab)
    window = context.window
    if len(sequence) > window:
        raise ValueError(f"the prompt holds {len(sequence)} tokens; the window is {window}")
    budget = min(params.max_tokens, window - len(sequence))
    picking = Picking(params, seed, guide)
    steering, observer = hooks.steering, Observer.of(hooks)
    reuse = seed is None and observer is None
    echo = params.prompt_logprobs
    me = object()
    try:
        prompt: tuple[Logprobs, ...] = ()
        with context.lock:  # the first token is picked with the prefill, under one lock
            if echo is None:
                cached = context.hold(sequence, me, reuse, steering, observer)
            else:
                scored = context.hold_scored(sequence, me, echo, steering, observer)
                cached, prompt = 0, tuple(scored)
            token = context.pick(picking) if budget > 0 else None
        yield Prefilled(cached_tokens=cached, prompt_logprobs=prompt)
        for left in range(budget, 0, -1):
            assert token is not None
            yield token
            if token.eos or left == 1:
                return
            sequence.append(token.token_id)
            picking.took(token.token_id)
            with context.lock:
                context.hold(sequence, me, reuse, steering, observer)
                token = context.pick(picking)
    finally:
        picking.close()
        if observer is not None:
            observer.record()


def check_ids(token_ids: Sequence[int], n_vocab: int) -> None:
    """Refuse ids outside the vocabulary (llama.cpp aborts the process on some)."""
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= n_vocab):
        bad = next(i for i in token_ids if not 0 <= i < n_vocab)
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
