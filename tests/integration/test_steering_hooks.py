"""Steering hooks on the transformers engine with the trained SmolLM2 SAE."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from miserver.engines.base import ChatPrompt, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.steering.applied import LIMIT as CLAMP
from miserver.steering.applied import AppliedSAE, applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tests.conftest import ONE_THREAD, cache_dir

pytestmark = pytest.mark.model

CHAT = ChatPrompt(({"role": "user", "content": "Tell me about your favourite place."},))


@pytest.fixture(scope="module")
def engine(gguf_path: object) -> Iterator[TransformersEngine]:
    loaded = load_transformers_engine(
        gguf_path, model_id="steer", cache_dir=cache_dir(), options=ONE_THREAD
    )  # type: ignore[arg-type]
    yield loaded
    loaded.close()


def layer_steering(sae: SAE, strengths: dict[int, float]) -> AppliedSAE:
    return applied_sae("inline", sae, sae.layer, strengths)


def fixed(*items: AppliedSAE) -> FixedSource:
    return FixedSource(snapshot(items))


def greedy(engine: TransformersEngine) -> list[int]:
    ids = engine.render_chat(CHAT)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    return [t.token_id for t in engine.generate(ids, params, None) if isinstance(t, Token)]


def strongest_feature(sae: SAE, engine: TransformersEngine) -> int:
    """A feature that fires on the prompt (so steering along it is meaningful)."""
    captured: list[torch.Tensor] = []
    layer = engine.model.model.layers[sae.layer]
    handle = layer.register_forward_hook(lambda _m, _a, out: captured.append(out.detach()))
    try:
        with torch.inference_mode():
            engine.model(torch.tensor([engine.render_chat(CHAT)]))
    finally:
        handle.remove()
    return int(sae.encode(captured[0][0]).sum(0).argmax())


def test_strength_zero_is_byte_identical_and_a_strong_feature_changes_output(
    engine: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-HASH-04, issue #4 acceptance: zero strength changes nothing; strong steering does."""
    plain = greedy(engine)
    index = strongest_feature(trained_sae, engine)
    zero = layer_steering(trained_sae, {index: 0.0, index + 1: -0.0})
    assert zero.applied == {} and zero.clamped == 0
    with engine.steered(fixed(zero)):
        assert greedy(engine) == plain
    strong = layer_steering(trained_sae, {index: 150.0})
    with engine.steered(fixed(strong)):
        changed = greedy(engine)
    assert changed != plain
    assert greedy(engine) == plain  # the hook is gone, and no steered KV prefix is reused


def test_decode_steps_are_steered_too(engine: TransformersEngine, trained_sae: SAE) -> None:
    """Issue #4 item 3: KV-cached decode steps are steered, not only the prompt's prefill."""
    index = strongest_feature(trained_sae, engine)
    steering = layer_steering(trained_sae, {index: 80.0})
    with engine.steered(fixed(steering)):
        ours = greedy(engine)
        prompt = engine.render_chat(CHAT)
        with torch.inference_mode():  # reference: re-run the whole sequence, steered, each step
            sequence = list(prompt)
            for _ in range(len(ours)):
                logits = engine.model(torch.tensor([sequence])).logits[0, -1]
                sequence.append(int(logits.argmax()))
    assert ours == sequence[len(prompt) :]


def test_strengths_are_clamped_and_counted(trained_sae: SAE) -> None:
    """OAI-INL-12, OAI-INL-13, OAI-HASH-05: ±200 at apply time, each clamp counted."""
    built = layer_steering(trained_sae, {1: 500.0, 2: -201.0, 3: 200.0, 4: 5.0})
    assert built.applied == {1: CLAMP, 2: -CLAMP, 3: 200.0, 4: 5.0}
    assert built.clamped == 2
    expected = (
        200 * trained_sae.W_dec[1]
        - 200 * trained_sae.W_dec[2]
        + 200 * trained_sae.W_dec[3]
        + 5 * trained_sae.W_dec[4]
    )
    assert torch.allclose(built.vector, expected, atol=1e-4)
    with pytest.raises(IndexError):
        layer_steering(trained_sae, {trained_sae.d_sae: 1.0})
    with pytest.raises(ValueError):
        layer_steering(trained_sae, {1: float("nan")})


def test_no_hook_is_left_after_an_error(engine: TransformersEngine, trained_sae: SAE) -> None:
    """Issue #4 acceptance: no hook is left attached after an error."""
    layer = engine.model.model.layers[trained_sae.layer]
    before = len(layer._forward_hooks)
    steering = layer_steering(trained_sae, {1: 10.0})
    with pytest.raises(RuntimeError), engine.steered(fixed(steering)):
        assert len(layer._forward_hooks) == before + 1
        raise RuntimeError("boom")
    assert len(layer._forward_hooks) == before
