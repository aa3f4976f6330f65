"""A request's activation reading: the ask resolved against the model, and what it reads.

`reading_of` resolves `return_sae_activations` (activations.py) against the
SAEs attached to the model, with every refusal that needs no prompt. The
layer's rows come from the engine's capture (a `Capture` hook per
generation), one per position fed to the model: every prompt token and
every generated token but the last, which is never fed back (OAI-ACT-05).
`read` encodes the rows of the positions asked for with the SAE in one
batched matmul, keeps the candidate features (`features`, else all), and
lists the `top_k` largest per position, largest first, index breaking ties
(OAI-ACT-06..08, 12).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...engines.base import Capture
from ...errors import InvalidParameter
from ...steering.live import Attachment
from ...steering.sae import SAE, placed
from .activations import (
    FIELD,
    NOTES,
    ActivationsAsk,
    check_ask,
    check_entries,
    check_sae,
    choose_sae,
    read_positions,
)
from .generation import Captured
from .prepared import Prepared
from .requests import GenerationRequest


@dataclass(frozen=True, slots=True)
class Reading:
    """An ask resolved against the model's attachments: the SAE, the layer it is attached
    at (where the rows are captured) and the ask."""

    ask: ActivationsAsk
    sae: SAE
    sae_id: str
    layer: int

    def capture(self) -> Capture:
        """What one generation reads: this layer, before or after its delta."""
        return Capture(self.layer, self.ask.pre_steering)

    def check(self, prepared: Prepared, *, max_entries: int) -> None:
        """The worst-case entry count, once the prompt's length is known (OAI-ACT-23)."""
        check_entries(
            self.ask,
            prompt_tokens=len(prepared.prompt_ids[0]),
            max_tokens=prepared.budgets[0],
            max_entries=max_entries,
        )

    def millm(self, captured: Captured | None, prepared: Prepared) -> dict[str, Any] | None:
        """The `millm` object of a response: what a generation's capture read (None: none)."""
        if captured is None:
            return None
        prompt_tokens = len(prepared.prompt_ids[0])
        return {"sae_activations": read(self, captured.rows, captured.token_ids, prompt_tokens)}


def reading_of(
    req: GenerationRequest, attached: Sequence[Attachment], *, max_top_k: int
) -> Reading | None:
    """`return_sae_activations` resolved against the SAEs attached to the model; every
    refusal that needs no prompt, before any load or generation (OAI-ACT-16..22). None
    when none was asked."""
    ask = req.activations
    if ask is None:
        return None
    if req.n > 1:
        raise InvalidParameter(
            "n", "n above 1 cannot be combined with return_sae_activations (one reading)."
        )
    if len(req.prompts) > 1:
        param = "extra_messages" if req.endpoint == "chat" else "prompt"
        raise InvalidParameter(
            param,
            "several prompts cannot be combined with return_sae_activations: there is "
            "no single position axis.",
        )
    if req.precision == "float32":  # OAI-F32-22
        raise InvalidParameter(
            "scoring_precision",
            'scoring_precision "float32" cannot be combined with return_sae_activations.',
        )
    attachments = [(a.sae.sae_id, a.layer, a.sae) for a in attached]
    return _chosen(ask, attachments, max_top_k=max_top_k)


def _chosen(
    ask: ActivationsAsk, attachments: Sequence[tuple[str, int, SAE]], *, max_top_k: int
) -> Reading:
    """The reading of `ask` among `attachments` ((sae_id, layer, SAE) each), or its refusal:
    every check that needs no prompt (OAI-ACT-19..22)."""
    check_ask(ask, max_top_k=max_top_k)
    sae_id = choose_sae(ask, sorted({name for name, _, _ in attachments}))
    found = [(layer, sae) for name, layer, sae in attachments if name == sae_id]
    if len(found) > 1:
        layers = ", ".join(str(layer) for layer, _ in found)
        raise InvalidParameter(
            f"{FIELD}.sae_id",
            f"SAE `{sae_id}` is attached at several layers ({layers}) of this model; "
            "detach all but the one to read.",
        )
    layer, sae = found[0]
    check_sae(ask, sae)
    return Reading(ask, sae, sae_id, layer)


def read(
    reading: Reading,
    rows: torch.Tensor,
    token_ids: Sequence[int],
    prompt_tokens: int,
    *,
    read_point: str | None = None,
) -> dict[str, Any]:
    """`millm.sae_activations` (OAI-ACT-12): `rows[p]` is the layer's output at position p
    (`token_ids[p]` fed there), one row per position fed. `read_point` overrides the
    ask's in the body (scoring reports `unsteered`, OAI-ACT-11)."""
    ask, sae = reading.ask, reading.sae
    fed = min(rows.shape[0], len(token_ids))
    wanted = read_positions(ask.positions, prompt_tokens, fed)
    listed: list[dict[str, Any]] = []
    if len(wanted):
        with torch.inference_mode():
            device = rows.device  # the model's: the SAE encodes there (issue 48)
            acts = placed(sae, device).encode(rows[wanted.start : wanted.stop]).float()
            candidates = None
            if ask.features is not None:
                chosen = sorted(set(ask.features))
                candidates = torch.tensor(chosen, dtype=torch.long, device=device)
                acts = acts[:, candidates]
            k = min(ask.top_k, acts.shape[1])
            # stable descending sort: equal values keep the lower index first
            order = torch.sort(acts, dim=1, descending=True, stable=True).indices[:, :k]
            values = torch.gather(acts, 1, order)
            indices = order if candidates is None else candidates[order]
        for row, position in enumerate(wanted):
            features = [
                {"index": int(index), "value": float(value)}
                for index, value in zip(indices[row].tolist(), values[row].tolist(), strict=True)
            ]
            listed.append(
                {"position": position, "token_id": int(token_ids[position]), "features": features}
            )
    point = read_point or ask.read_point
    return {
        "sae_id": reading.sae_id,
        "layer": reading.layer,
        "read_point": point,
        "positions": listed,
        "note": NOTES[point],
    }
