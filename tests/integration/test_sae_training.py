"""tools/sae_train.py on the real SmolLM2: deterministic, loadable, better than the mean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from miserver.steering.sae import SAE, SAERegistry, load_sae
from tests.conftest import ONE_THREAD
from tools import sae_train

pytestmark = pytest.mark.model

TINY = sae_train.TrainConfig(tokens=2048, d_sae=64, gen_tokens=8, epochs=8)
TINY_PROMPTS = 15  # of the trainer's 50: three held out
FRESH = (
    "The library in our town opens at nine in the morning and closes late on Thursdays, "
    "when volunteers run a reading club for children. Last winter the mountains to the north "
    "were covered in snow for months, so the road to the valley was often closed and the bus "
    "came twice a week. To add two numbers in Python you can write def add(a, b): return a + b, "
    "then call add(2, 3). Many people believe that a good breakfast, a short walk and a quiet "
    "hour without a phone make the day better."
)


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    loaded = load_transformers_engine(
        sae_train.smollm2_gguf(),
        model_id=sae_train.MODEL_NAME,
        cache_dir=sae_train.cache_dir(),
        options=ONE_THREAD,
    )
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def tiny(engine: TransformersEngine, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The tiny config trained twice, each into its own folder, on the first `TINY_PROMPTS`
    prompts (the texts' generation, a batch of every prompt, is most of a run's time)."""
    folders = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sae_train, "PROMPTS", sae_train.PROMPTS[:TINY_PROMPTS])
        for run in ("first", "second"):
            trained = sae_train.train(engine.model, engine.tokenizer, TINY)
            folder = tmp_path_factory.mktemp(run) / TINY.name()
            sae_train.write(folder, TINY, trained)
            folders.append(folder)
    return folders


def fresh_activations(engine: TransformersEngine, layer: int) -> torch.Tensor:
    """Layer outputs on text the trainer never saw (one ~110-token window, sinks dropped)."""
    ids = torch.tensor([engine.tokenizer(FRESH, add_special_tokens=False).input_ids])
    return sae_train.typical(sae_train.collect(engine.model, ids, layer))


def explained_variance(sae: SAE, x: torch.Tensor) -> float:
    residual = (x - sae.decode(sae.encode(x))).pow(2).sum()
    return 1.0 - float(residual / (x - x.mean(0)).pow(2).sum())


def test_two_runs_write_identical_bytes(tiny: list[Path]) -> None:
    first, second = tiny
    for name in ("sae_weights.safetensors", "cfg.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_output_loads_fits_and_beats_the_mean(tiny: list[Path], engine: TransformersEngine) -> None:
    sae = load_sae(tiny[0])
    assert (sae.architecture, sae.d_in, sae.d_sae, sae.layer) == ("standard", 576, 64, 12)
    assert sae.hook_name == "blocks.12.hook_resid_post"
    config = engine.model.config
    SAERegistry.check_fits(sae, config.hidden_size, config.num_hidden_layers)
    assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(64), atol=1e-5)
    assert explained_variance(sae, fresh_activations(engine, sae.layer)) > 0.0


def test_cached_default_sae_reconstructs(trained_sae: SAE, engine: TransformersEngine) -> None:
    assert (trained_sae.d_in, trained_sae.d_sae, trained_sae.layer) == (576, 2048, 12)
    x = fresh_activations(engine, trained_sae.layer)
    assert explained_variance(trained_sae, x) > 0.35
    l0 = float((trained_sae.encode(x) > 0).sum(-1).float().mean())
    assert 1.0 < l0 < 512.0
