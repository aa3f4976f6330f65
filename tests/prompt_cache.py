"""What the prompt cache's engine tests share (issue 43): prompts that share a long system
prompt, prompts that share only the template's head, and one greedy answer with its
cached count, on the serial path or on a row of the batch, on either engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miserver.engines.base import (
    ChatPrompt,
    Engine,
    Hooks,
    Joiner,
    Prefilled,
    SamplingParams,
    SteeringSource,
    Token,
)
from tools.device_check.engine import stepped

TOKENS = 16
SYSTEM = "You are a careful assistant who answers in detail and names your sources. " * 6


@dataclass(frozen=True)
class Answer:
    cached: int  # prompt tokens found cached (held, or restored from the prompt cache)
    tokens: list[int]
    logprobs: list[float]

    def close_to(self, other: Answer, tolerance: float) -> bool:
        """The same length, each log-probability within `tolerance` of `other`'s."""
        return len(self.logprobs) == len(other.logprobs) and all(
            abs(x - y) <= tolerance for x, y in zip(self.logprobs, other.logprobs, strict=True)
        )


def prompt(engine: Engine, question: str, system: str = SYSTEM) -> list[int]:
    messages = ({"role": "system", "content": system}, {"role": "user", "content": question})
    return engine.render_chat(ChatPrompt(messages))


def push(engine: Engine, k: int) -> None:
    """One prompt of `other`'s answered with one token: its prefill takes a sequence, which
    is all a test needs of it (pushing a prompt's keys and values out)."""
    answer(engine, other(engine, k), tokens=1)


def other(engine: Engine, k: int) -> list[int]:
    """A prompt sharing only the template's head with `prompt`'s."""
    content = f"Question {k}: what is {k} times {k + 3}? Show the working, step by step."
    return engine.render_chat(ChatPrompt(({"role": "user", "content": content},)))


def answer(
    engine: Engine,
    ids: Sequence[int],
    steering: SteeringSource | None = None,
    tokens: int = TOKENS,
) -> Answer:
    """`tokens` greedy tokens with their log-probabilities: on the serial path, or on a row
    when the engine batches."""
    params = SamplingParams(max_tokens=tokens, temperature=0, logprobs=2)
    hooks = Hooks(steering=steering)
    batch = engine.batch
    if batch is None:
        items = list(engine.generate(ids, params, None, hooks))
        assert isinstance(items[0], Prefilled)
        cached, tokens = items[0].cached_tokens, items[1:]
    else:
        [row] = batch.join_all([Joiner(ids, params, None, hooks)])
        cached, tokens = row.cached, list(stepped(batch, [row])[0])
    out = [t for t in tokens if isinstance(t, Token)]
    logprobs = [t.logprobs.logprob for t in out if t.logprobs is not None]
    return Answer(cached, [t.token_id for t in out], logprobs)


def cold_then_restored(engine: Engine, ids: Sequence[int]) -> tuple[Answer, Answer]:
    """`ids` answered cold, then again after three other prompts pushed its KV out of every
    sequence (more than any batch here has): the second finds all but its last token cached,
    as one more hit of the engine's prompt cache."""
    cache = engine.prompt_cache
    assert cache is not None
    first = answer(engine, ids)
    assert first.cached < 40  # at most the template's head was held
    for k in range(3):
        push(engine, k)
    hits = cache.counts.hits
    again = answer(engine, ids)
    assert again.cached == len(ids) - 1
    assert cache.counts.hits == hits + 1
    return first, again
