"""SAELens-layout SAEs: loading, the three activation functions, refusals, the registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miserver.steering.sae import SAE, SAEFormatError, SAERegistry, load_sae
from tests.saes import D_IN, D_SAE, cfg_for, weights_for, write_sae


def make(tmp_path: Path, architecture: str, name: str = "sae") -> SAE:
    folder = write_sae(tmp_path / name, cfg_for(architecture), weights_for(architecture))
    return load_sae(folder)


def pre_activations(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    return (x - sae.b_dec) @ sae.W_enc + sae.b_enc


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_loads_each_architecture_with_shapes(tmp_path: Path, architecture: str) -> None:
    sae = make(tmp_path, architecture)
    assert (sae.sae_id, sae.architecture, sae.d_in, sae.d_sae) == ("sae", architecture, 8, 16)
    assert (sae.layer, sae.hook_name) == (3, "blocks.3.hook_resid_post")
    x = torch.randn(2, 5, D_IN)
    acts = sae.encode(x)
    assert acts.shape == (2, 5, D_SAE)
    assert sae.decode(acts).shape == (2, 5, D_IN)
    assert (sae.threshold is not None) == (architecture == "jumprelu")
    assert sae.k == (3 if architecture == "topk" else None)


def test_relu_encode_and_decode(tmp_path: Path) -> None:
    sae = make(tmp_path, "standard")
    x = torch.randn(4, D_IN)
    acts = sae.encode(x)
    assert torch.equal(acts, torch.relu(pre_activations(sae, x)))
    assert torch.allclose(sae.decode(acts), acts @ sae.W_dec + sae.b_dec)


def test_jumprelu_zeroes_below_threshold(tmp_path: Path) -> None:
    sae = make(tmp_path, "jumprelu")
    x = torch.randn(64, D_IN)
    pre, acts = pre_activations(sae, x), sae.encode(x)
    assert torch.equal(acts[pre <= 0.5], torch.zeros_like(acts[pre <= 0.5]))
    assert torch.equal(acts[pre > 0.5], pre[pre > 0.5])


def test_topk_keeps_the_k_largest(tmp_path: Path) -> None:
    sae = make(tmp_path, "topk")
    x = torch.randn(32, D_IN)
    pre, acts = pre_activations(sae, x), sae.encode(x)
    assert ((acts > 0).sum(-1) <= 3).all()
    top = torch.topk(torch.relu(pre), 3, dim=-1)
    assert torch.equal(acts.gather(-1, top.indices), top.values)


def test_topk_from_saelens_5_activation_fn(tmp_path: Path) -> None:
    cfg = cfg_for("standard", activation_fn_str="topk", activation_fn_kwargs={"k": 2})
    sae = load_sae(write_sae(tmp_path / "old", cfg, weights_for("standard")))
    assert (sae.architecture, sae.k) == ("topk", 2)


def test_top_level_hook_fields_and_explicit_id(tmp_path: Path) -> None:
    cfg = cfg_for("standard", hook_name="blocks.7.hook_resid_post", hook_layer=7)
    del cfg["metadata"]
    sae = load_sae(write_sae(tmp_path / "folder", cfg, weights_for("standard")), "my-id")
    assert (sae.sae_id, sae.layer) == ("my-id", 7)


def test_decoder_direction_bounds(tmp_path: Path) -> None:
    """OAI-INL-08: feature indices outside 0..d_sae-1 are refused."""
    sae = make(tmp_path, "standard")
    assert torch.equal(sae.decoder_direction(D_SAE - 1), sae.W_dec[D_SAE - 1])
    for bad in (-1, D_SAE):
        with pytest.raises(IndexError, match=r"outside 0\.\.15"):
            sae.decoder_direction(bad)


def _without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


BAD_LAYOUTS: dict[str, tuple[Any, Any, str]] = {
    "no cfg": (None, weights_for("standard"), "cfg.json: missing"),
    "no weights": (cfg_for("standard"), None, "safetensors: missing"),
    "unknown arch": (cfg_for("gated"), weights_for("standard"), "unknown architecture 'gated'"),
    "no d_in": (_without(cfg_for("standard"), "d_in"), weights_for("standard"), "d_in"),
    "no hook": (_without(cfg_for("standard"), "metadata"), weights_for("standard"), "hook_name"),
    "topk no k": (_without(cfg_for("topk"), "k"), weights_for("topk"), "needs a positive"),
    "no W_dec": (
        cfg_for("standard"),
        _without(weights_for("standard"), "W_dec"),
        "W_dec is missing",
    ),
    "jumprelu no threshold": (
        cfg_for("jumprelu"),
        weights_for("standard"),
        "threshold is missing",
    ),
    "W_enc transposed": (
        cfg_for("standard"),
        {**weights_for("standard"), "W_enc": torch.zeros(D_SAE, D_IN)},
        r"W_enc has shape \[16, 8\], expected \[8, 16\]",
    ),
    "d_sae disagrees": (
        cfg_for("standard", d_sae=32),
        weights_for("standard"),
        "expected",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LAYOUTS))
def test_bad_layouts_are_refused(tmp_path: Path, case: str) -> None:
    cfg, weights, message = BAD_LAYOUTS[case]
    folder = write_sae(tmp_path / "bad", cfg, weights)
    with pytest.raises(SAEFormatError, match=message):
        load_sae(folder)


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "junk"
    folder.mkdir()
    (folder / "cfg.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(SAEFormatError, match="not readable JSON"):
        load_sae(folder)
    (folder / "cfg.json").write_text(json.dumps(cfg_for("standard")), encoding="utf-8")
    (folder / "sae_weights.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SAEFormatError, match="not a safetensors file"):
        load_sae(folder)


def test_registry_lists_loads_once_and_checks_fit(tmp_path: Path) -> None:
    for name in ("b-sae", "a-sae"):
        write_sae(tmp_path / name, cfg_for("standard"), weights_for("standard"))
    (tmp_path / "not-an-sae").mkdir()
    registry = SAERegistry(tmp_path)
    assert registry.ids() == ["a-sae", "b-sae"]
    sae = registry.get("a-sae")
    assert registry.get("a-sae") is sae and sae.sae_id == "a-sae"
    with pytest.raises(KeyError):
        registry.get("not-an-sae")
    SAERegistry.check_fits(sae, d_model=D_IN, n_layers=4)
    with pytest.raises(SAEFormatError, match="d_in 8 but the model's d_model is 576"):
        SAERegistry.check_fits(sae, d_model=576, n_layers=30)
    with pytest.raises(SAEFormatError, match="layer 3 but the model has 2 layers"):
        SAERegistry.check_fits(sae, d_model=D_IN, n_layers=2)


def test_registry_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert SAERegistry(tmp_path / "absent").ids() == []
