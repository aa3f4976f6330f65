"""Capturing a layer's residuals during generation on the transformers engine (OAI-ACT),
with the trained SmolLM2 SAE, against a direct forward hooked at the same layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from miserver.engines.base import ChatPrompt, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.serving.completions.activations import ActivationsAsk
from miserver.serving.completions.reading import Reading, read
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tests.conftest import ONE_THREAD, cache_dir
from tests.engines import direct

pytestmark = pytest.mark.model

CHAT = ChatPrompt(({"role": "user", "content": "Tell me about your favourite place."},))
TOKENS = 12


@pytest.fixture(scope="module")
def engine(gguf_path: object) -> Iterator[TransformersEngine]:
    loaded = load_transformers_engine(
        gguf_path, model_id="act", cache_dir=cache_dir(), options=ONE_THREAD
    )  # type: ignore[arg-type]
    yield loaded
    loaded.close()


def generated(engine: TransformersEngine, ids: list[int]) -> list[int]:
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    return [t.token_id for t in engine.generate(ids, params, None) if isinstance(t, Token)]


def test_captured_rows_equal_a_direct_forward_over_prompt_and_completion(
    engine: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-ACT-04/05: one row per position fed (the prompt, then every generated token but
    the last), each equal to a direct hooked forward over the same tokens at that position;
    a kept prefix is not reused, so the prompt's rows are all there."""
    ids = engine.render_chat(CHAT)
    generated(engine, ids)  # the engine now keeps this prompt's prefix
    with engine.capturing(trained_sae.layer, pre_steering=False) as residuals:
        out = generated(engine, ids)
    rows = residuals.rows()
    assert len(out) == TOKENS
    assert rows.shape[0] == len(ids) + len(out) - 1  # the last token is never fed
    reference = direct(engine, [*ids, *out[:-1]], trained_sae.layer)
    torch.testing.assert_close(rows, reference, atol=2e-3, rtol=1e-3)
    assert len(engine.model.model.layers[trained_sae.layer]._forward_hooks) == 0


def test_pre_steering_and_post_steering_differ_by_this_layers_delta(
    engine: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-ACT-09/10: post_steering reads after this layer's steering delta, pre_steering
    before it; at every position the two differ by exactly that delta."""
    ids = engine.render_chat(CHAT)
    applied = applied_sae("inline", trained_sae, trained_sae.layer, {3: 40.0, 17: -25.0})
    source = FixedSource(snapshot([applied]))
    delta = source.vector(trained_sae.layer)
    assert delta is not None
    layer = trained_sae.layer
    with (
        engine.steered(source),
        engine.capturing(layer, pre_steering=True) as pre,
        engine.capturing(layer, pre_steering=False) as post,
    ):
        out = generated(engine, ids)
    assert pre.rows().shape == post.rows().shape == (len(ids) + len(out) - 1, delta.shape[0])
    # the steering hook's own addition, redone in the model's dtype: equal to the last bit
    dtype = engine.model.dtype
    expected = (pre.rows().to(dtype) + delta.to(dtype)).float()
    torch.testing.assert_close(post.rows(), expected, atol=0, rtol=0)
    assert not torch.allclose(post.rows(), pre.rows())


def test_read_encodes_the_positions_asked_for_with_the_sae(
    engine: TransformersEngine, trained_sae: SAE
) -> None:
    """OAI-ACT-03/06/07/08/12/13: the positions read, their token ids, the top_k largest
    candidate activations per position, largest first, as the SAE encodes each row."""
    ids = engine.render_chat(CHAT)
    with engine.capturing(trained_sae.layer, pre_steering=False) as residuals:
        out = generated(engine, ids)
    rows, fed = residuals.rows(), [*ids, *out[:-1]]
    full = trained_sae.encode(rows).float()
    ask = ActivationsAsk(positions="completion", top_k=4)
    body = read(Reading(ask, trained_sae, "sae-x", trained_sae.layer), rows, fed, len(ids))
    assert (body["sae_id"], body["layer"], body["read_point"]) == (
        "sae-x",
        trained_sae.layer,
        "post_steering",
    )
    assert "not an unsteered counterfactual" in body["note"]
    listed = body["positions"]
    assert [p["position"] for p in listed] == list(range(len(ids), len(fed)))
    for entry in listed:
        position = entry["position"]
        assert entry["token_id"] == fed[position]
        values = [f["value"] for f in entry["features"]]
        assert len(values) == 4 and values == sorted(values, reverse=True)
        top = torch.topk(full[position], 4).values.tolist()
        assert values == pytest.approx(top, rel=1e-5, abs=1e-4)
        for feature in entry["features"]:
            assert feature["value"] == pytest.approx(
                float(full[position, feature["index"]]), rel=1e-5, abs=1e-4
            )
    candidates = (5, 11, 200)
    narrowed = read(
        Reading(
            ActivationsAsk(positions=(2, 5), top_k=2, features=candidates),
            trained_sae,
            "sae-x",
            trained_sae.layer,
        ),
        rows,
        fed,
        len(ids),
    )
    assert [p["position"] for p in narrowed["positions"]] == [2, 3, 4]
    for entry in narrowed["positions"]:
        assert {f["index"] for f in entry["features"]} <= set(candidates)
        assert len(entry["features"]) == 2
