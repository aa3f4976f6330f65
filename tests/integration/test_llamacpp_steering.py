"""Steering on the llama.cpp engine (issue 46): the trained SmolLM2 SAE's vectors as the
context's control vector, on the serial path and on rows of the batch, against the
transformers engine steered by the same SAE.

llama.cpp adds the vector to a layer's output, where the transformers hook adds it
(engines/llamacpp/steering.py). The GGUF computes from Q4_1 blocks and the transformers
engine from their float32 dequantization: unsteered, their log-probabilities of the same
tokens differ by up to 0.24 on this prompt, and a greedy reply follows the other engine's
until a near tie falls the other way. So the documented tolerance (docs/DECISIONS.md,
contract 0.25.0) is: the steered greedy replies share their first `AGREE` tokens, and fed
the transformers engine's steered reply, the two engines' steered log-probabilities of each
of its tokens are within `LOGPROB_TOLERANCE`, while the steering itself moves them by far more.
"""

from __future__ import annotations

import pytest

from miserver.engines.base import (
    ChatPrompt,
    Engine,
    Hooks,
    Joiner,
    Prefilled,
    SamplingParams,
    Token,
)
from miserver.engines.llamacpp import LlamaCppEngine
from miserver.engines.transformers import TransformersEngine
from miserver.steering.applied import AppliedSAE, applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

CHAT = ChatPrompt(({"role": "user", "content": "Tell me about your favourite place."},))
OTHER = ChatPrompt(({"role": "user", "content": "What is the capital of France?"},))
FEATURE = 5  # a feature of the trained SAE that visibly moves SmolLM2 (test_scoring)
STRENGTH = 80.0  # the reply moves from its second token on
TOKENS = 16
AGREE = 3  # greedy tokens the two engines' steered replies share at least
LOGPROB_TOLERANCE = 0.3  # Q4_1 against its float32 dequantization, as unsteered


@pytest.fixture(scope="module")
def gguf(engine_pair: tuple[LlamaCppEngine, TransformersEngine]) -> LlamaCppEngine:
    return engine_pair[0]


@pytest.fixture(scope="module")
def hf(engine_pair: tuple[LlamaCppEngine, TransformersEngine]) -> TransformersEngine:
    return engine_pair[1]


def steering(sae: SAE, strength: float, feature: int = FEATURE) -> AppliedSAE:
    return applied_sae("inline", sae, sae.layer, {feature: strength})


def fixed(*items: AppliedSAE) -> FixedSource:
    return FixedSource(snapshot(items))


def greedy(engine: Engine, chat: ChatPrompt, hooks: Hooks) -> list[int]:
    ids = engine.render_chat(chat)
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    return [t.token_id for t in engine.generate(ids, params, None, hooks) if isinstance(t, Token)]


def echoed(engine: Engine, ids: list[int], hooks: Hooks) -> list[float]:
    """The log-probability of each of `ids` after the first, under `hooks` (an echo)."""
    params = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs=0)
    [prefilled] = [p for p in engine.generate(ids, params, None, hooks) if isinstance(p, Prefilled)]
    return [entry.logprob for entry in prefilled.prompt_logprobs]


def test_a_steered_reply_differs_and_matches_the_transformers_engine(
    gguf: LlamaCppEngine, hf: TransformersEngine, trained_sae: SAE
) -> None:
    """Issue 46: a steered greedy reply on GGUF differs from the unsteered one and equals the
    transformers engine's, steered by the same SAE, within the tolerance above; unsteered
    after it again (no steered KV reused, the control vector cleared)."""
    plain = greedy(gguf, CHAT, Hooks())
    ours = greedy(gguf, CHAT, Hooks(steering=fixed(steering(trained_sae, STRENGTH))))
    theirs = greedy(hf, CHAT, Hooks(steering=fixed(steering(trained_sae, STRENGTH))))
    assert ours != plain
    assert ours[:AGREE] == theirs[:AGREE]
    assert greedy(gguf, CHAT, Hooks()) == plain

    ids = [*hf.render_chat(CHAT), *theirs]
    steered = [Hooks(steering=fixed(steering(trained_sae, STRENGTH))) for _ in range(2)]
    on_gguf, on_hf = echoed(gguf, ids, steered[0]), echoed(hf, ids, steered[1])
    reply = slice(-len(theirs), None)
    gaps = [abs(a - b) for a, b in zip(on_gguf[reply], on_hf[reply], strict=True)]
    assert max(gaps) < LOGPROB_TOLERANCE
    unsteered = echoed(gguf, ids, Hooks())[reply]
    moved = [abs(a - b) for a, b in zip(on_gguf[reply], unsteered, strict=True)]
    assert max(moved) > 10 * LOGPROB_TOLERANCE


def test_strength_zero_changes_nothing(gguf: LlamaCppEngine, trained_sae: SAE) -> None:
    """OAI-HASH-04 on GGUF: an applied set of zeros adds nothing, byte for byte."""
    plain = greedy(gguf, CHAT, Hooks())
    zero = steering(trained_sae, 0.0)
    assert zero.applied == {}
    assert greedy(gguf, CHAT, Hooks(steering=fixed(zero))) == plain


def test_layer_zero_is_refused(gguf: LlamaCppEngine, trained_sae: SAE) -> None:
    """llama.cpp's control vector has no slot for layer 0: refused, naming the layers."""
    assert gguf.steerable_layers == range(1, gguf.facts.n_layers)
    at_zero = applied_sae("inline", trained_sae, 0, {FEATURE: 10.0})
    with pytest.raises(ValueError, match="layer 0"):
        greedy(gguf, CHAT, Hooks(steering=fixed(at_zero)))


def test_rows_steered_differently_each_get_their_own_text(
    gguf: LlamaCppEngine, trained_sae: SAE
) -> None:
    """Issue 46: rows of one batch with different steering (none, one feature, the same
    feature pushed the other way) each decode what they decode alone on the serial path."""
    sources = [
        None,
        fixed(steering(trained_sae, STRENGTH)),
        fixed(steering(trained_sae, -STRENGTH)),
    ]
    chats = [CHAT, CHAT, OTHER]
    alone = [greedy(gguf, c, Hooks(steering=s)) for c, s in zip(chats, sources, strict=True)]
    assert len({tuple(a) for a in alone[:2]}) == 2
    batch = gguf.batch
    assert batch is not None
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    joiners = [
        Joiner(gguf.render_chat(c), params, None, Hooks(steering=s))
        for c, s in zip(chats, sources, strict=True)
    ]
    rows = batch.join_all(joiners)
    assert not any(isinstance(r, Exception) for r in rows)
    together = stepped(batch, rows)  # type: ignore[arg-type]
    assert [[t.token_id for t in row] for row in together] == alone
