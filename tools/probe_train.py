"""Train a linear probe on SmolLM2's residual stream, deterministically (issue #18 item 4).

Tests need a real probe, and none is published for SmolLM2: this one tells
French from English. It writes a `mi.probe/v1` sidecar and its weights:

    python -m tools.probe_train --out DIR [--layer 12] [--seed 0]

    DIR/french.json          the sidecar (spec/schemas/mi-probe-v1.json), its held-out
                             accuracy in `description`
    DIR/french.safetensors   weight [576], bias [1] (float32)
    DIR/metrics.json         train and held-out accuracy and counts

Data: the SENTENCES below, written for this project, one French and one
English sentence on each of many topics (not translations of each other, so
the probe cannot key on topic). Every fifth pair is held out. Each sentence is
rendered as one user message through the model's chat template, and its
feature is the mean of layer L's output over the message's content (the
`last_user` window exactly as the server places it: `user_span`), read with
the server's own capture hook.

Training: features standardised, logistic regression with L2 by full-batch
L-BFGS in float64 from zeros; the standardisation is folded back into the
weights, so the probe reads raw residual vectors. The link is sigmoid and the
threshold 0.5: a score is the probability the text is French.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import load_transformers_engine
from miserver.engines.transformers.capture import captured

from .sae_train import MODEL_NAME, cache_dir, smollm2_gguf

NAME = "french"
HOLDOUT_EVERY = 5
log = logging.getLogger("probe_train")

# (French, English) on unrelated topics within a pair.
SENTENCES: tuple[tuple[str, str], ...] = (
    (
        "Le train pour Lyon part à huit heures du matin.",
        "My grandmother grows tomatoes in her garden.",
    ),
    (
        "Je voudrais une baguette et deux croissants, s'il vous plaît.",
        "The meeting has been moved to Thursday afternoon.",
    ),
    (
        "Il pleut depuis trois jours sur la Bretagne.",
        "Can you recommend a good book about history?",
    ),
    ("Nous avons visité le musée du Louvre hier.", "The cat is sleeping on the warm windowsill."),
    (
        "Mon frère travaille comme médecin à Marseille.",
        "Please turn off the lights when you leave.",
    ),
    ("La soupe à l'oignon est très bonne en hiver.", "Our team won the football match last night."),
    ("Les enfants jouent dans le parc après l'école.", "The price of coffee has gone up again."),
    (
        "Pouvez-vous m'expliquer comment fonctionne ce moteur ?",
        "She learned to play the piano as a child.",
    ),
    ("J'ai oublié mon parapluie dans le métro.", "The mountains were covered in fresh snow."),
    ("Elle lit un roman policier chaque semaine.", "How long does it take to bake bread at home?"),
    ("Le chat dort sur le canapé du salon.", "The new bridge will open to traffic next year."),
    (
        "Nous partons en vacances au bord de la mer.",
        "I need to buy batteries for the remote control.",
    ),
    ("Quelle est la capitale de l'Australie ?", "The river flooded the fields near the village."),
    (
        "Mon ordinateur est tombé en panne ce matin.",
        "He writes letters to his friends every month.",
    ),
    ("Les feuilles des arbres tombent en automne.", "The restaurant serves fresh fish on Fridays."),
    ("Il faut arroser les plantes tous les deux jours.", "The museum is closed on Mondays."),
    ("Je cherche un appartement près de la gare.", "Our neighbours adopted a small brown dog."),
    ("Le concert commence à vingt heures trente.", "Why do birds fly south in the winter?"),
    ("Ma voisine prépare une tarte aux pommes.", "The students are preparing for their exams."),
    ("Ce film a reçu plusieurs prix au festival.", "I left my keys on the kitchen table."),
    ("La bibliothèque ferme à dix-huit heures.", "The airplane landed safely despite the storm."),
    ("Nous devons acheter du lait et des œufs.", "She painted the fence a bright shade of blue."),
    (
        "Le professeur explique la leçon de mathématiques.",
        "The hotel offers a free breakfast to guests.",
    ),
    (
        "Il a couru le marathon de Paris en quatre heures.",
        "My phone battery dies too quickly these days.",
    ),
    ("Les vendanges ont commencé en Bourgogne.", "The library has a large collection of maps."),
    ("Je n'aime pas attendre le bus sous la pluie.", "They built a treehouse in the backyard."),
    (
        "La réunion est reportée à la semaine prochaine.",
        "The soup needs a little more salt and pepper.",
    ),
    (
        "Mon grand-père raconte des histoires de guerre.",
        "We watched the sunset from the top of the hill.",
    ),
    (
        "Le boulanger se lève très tôt chaque jour.",
        "The company released a new version of its software.",
    ),
    ("Elle a appris à nager cet été.", "Traffic was heavy on the highway this morning."),
    (
        "Les étoiles brillent dans le ciel de la campagne.",
        "He forgot to water the plants before his trip.",
    ),
    ("Veux-tu venir dîner chez nous samedi soir ?", "The doctor told him to rest for a week."),
    ("La tour Eiffel est illuminée la nuit.", "Our flight was delayed by two hours."),
    ("Je dois rendre ce livre à la bibliothèque.", "The children built a snowman in the yard."),
    ("Le marché du dimanche est plein de couleurs.", "She is learning Japanese in the evenings."),
    ("Il fait trop chaud pour travailler dehors.", "The store is having a sale on winter coats."),
    ("Nous avons perdu le match de rugby.", "The scientist published her results in a journal."),
    ("Ma sœur habite dans un petit village alpin.", "Can you help me carry these boxes upstairs?"),
    (
        "Le fromage de chèvre se marie bien avec le miel.",
        "The old clock in the hall stopped at noon.",
    ),
    (
        "Les élèves visitent une ferme au printemps.",
        "He repaired the bicycle with a few simple tools.",
    ),
)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything that decides the weights; its digest names the cached probe."""

    layer: int = 12
    seed: int = 0
    l2: float = 1e-2
    iterations: int = 200

    def digest(self) -> str:
        """Hash of this config and of this file's source (a changed trainer is a new probe)."""
        text = json.dumps(asdict(self), sort_keys=True) + Path(__file__).read_text("utf-8")
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def name(self) -> str:
        return f"smollm2-135m-l{self.layer}-{NAME}-{self.digest()}"


def features(engine: Any, texts: Sequence[str], layer: int) -> torch.Tensor:
    """Each text's mean layer-`layer` output over its `last_user` window, [texts, width]."""
    rows = []
    for text in texts:
        prompt = ChatPrompt(messages=[{"role": "user", "content": text}])
        ids = engine.render_chat(prompt)
        span = engine.user_span(prompt)
        if span is None:
            raise RuntimeError(f"no user span in the render of {text!r}")
        with (
            captured(engine.model, layer, pre_steering=True) as residuals,
            torch.inference_mode(),
        ):
            engine.model(input_ids=torch.tensor([ids]), use_cache=False)
        start, end = span
        rows.append(residuals.rows()[start:end].double().mean(dim=0))
    return torch.stack(rows)


def fit(x: torch.Tensor, y: torch.Tensor, config: TrainConfig) -> tuple[torch.Tensor, float]:
    """Logistic regression on standardised x (float64, L-BFGS from zeros), folded back into
    raw units: (weight, bias) such that sigmoid(weight . x + bias) is P(French)."""
    torch.manual_seed(config.seed)
    mean, std = x.mean(dim=0), x.std(dim=0).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=config.iterations, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        logits = z @ w + b
        value = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        value = value + config.l2 * (w * w).sum()
        value.backward()  # type: ignore[no-untyped-call]
        return value

    optimizer.step(loss)  # type: ignore[no-untyped-call]
    weight = (w / std).detach()
    bias = float((b - (w * mean / std).sum()).detach())
    return weight, bias


def accuracy(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: float) -> float:
    return float(((x @ weight + bias > 0).double() == y).double().mean())


def build(out: Path, config: TrainConfig) -> dict[str, Any]:
    """Load SmolLM2, read the features, fit, write `out`; returns the metrics."""
    engine = load_transformers_engine(smollm2_gguf(), model_id=MODEL_NAME, cache_dir=cache_dir())
    try:
        texts, labels = [], []
        for french, english in SENTENCES:
            texts += [french, english]
            labels += [1.0, 0.0]
        x = features(engine, texts, config.layer)
    finally:
        engine.close()
    y = torch.tensor(labels, dtype=torch.float64)
    held = torch.tensor([(i // 2) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 for i in range(len(texts))])
    weight, bias = fit(x[~held], y[~held], config)
    metrics = {
        "train_accuracy": accuracy(x[~held], y[~held], weight, bias),
        "heldout_accuracy": accuracy(x[held], y[held], weight, bias),
        "train_texts": int((~held).sum()),
        "heldout_texts": int(held.sum()),
        "layer": config.layer,
    }
    write(out, config, weight, bias, metrics)
    return metrics


def write(
    out: Path, config: TrainConfig, weight: torch.Tensor, bias: float, metrics: dict[str, Any]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {"weight": weight.float().contiguous(), "bias": torch.tensor([bias], dtype=torch.float32)},
        str(out / f"{NAME}.safetensors"),
    )
    sidecar = {
        "schema": "mi.probe/v1",
        "name": NAME,
        "description": (
            f"French vs English in a user message: SmolLM2-135M-Instruct layer {config.layer}, "
            f"mean over the message, logistic regression (tools/probe_train.py); held-out "
            f"accuracy {metrics['heldout_accuracy']:.3f} on {metrics['heldout_texts']} texts."
        ),
        "detector": {
            "kind": "linear",
            "layer": config.layer,
            "link": "sigmoid",
            "file": f"{NAME}.safetensors",
        },
        "aggregate": "mean",
        "threshold": 0.5,
        "windows": ["last_user", "completion"],
    }
    (out / f"{NAME}.json").write_text(json.dumps(sidecar, indent=2) + "\n", "utf-8")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", "utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="python -m tools.probe_train", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layer", type=int, default=TrainConfig().layer)
    parser.add_argument("--seed", type=int, default=TrainConfig().seed)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one reduction order: two runs write the same bytes
    started = time.monotonic()
    metrics = build(args.out, TrainConfig(layer=args.layer, seed=args.seed))
    log.info("wrote %s in %.1f s: %s", args.out, time.monotonic() - started, json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
