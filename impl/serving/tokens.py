"""Token ids back to text: each id's own piece, by the resident model's tokenizer
(POST /api/detokenize)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ApiError
from ..models.manager import ModelManager


async def pieces(manager: ModelManager, ids: Sequence[int]) -> dict[str, Any]:
    """`{model, pieces}`: one piece an id, in order; 400 for an id outside the vocabulary,
    503 `no_model` with none loaded."""
    resident = manager.resident
    if resident is None:
        raise ApiError("no_model", "No model is loaded: load one, then ask for its tokens.", None)
    engine = resident.engine
    size = engine.facts.vocab_size
    outside = next((i for i, token in enumerate(ids) if token >= size), None)
    if outside is not None:
        raise ApiError(
            "invalid_parameter",
            f"Token {ids[outside]} is outside the vocabulary of {size} tokens.",
            f"tokens[{outside}]",
        )
    decoded = await manager.with_tokenizer(lambda: [engine.token_text(token) for token in ids])
    return {"model": resident.entry.model_id, "pieces": decoded}
