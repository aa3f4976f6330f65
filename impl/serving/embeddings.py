"""`POST /v1/embeddings` (OAI-EMB): one vector per input, never truncated, never steered.

Order is the contract's: the input limits and the field policy before any
load; then the slot and the model; then every input tokenised and measured
before any forward pass (an over-limit input refuses the whole request);
then the vectors, checked (never NaN or infinity), normalised if asked, and
encoded as floats or base64 of little-endian float32.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any

import numpy as np

from ..engines.base import EmbeddingsDisabled, Engine, EngineId
from ..engines.capabilities import Embedder
from ..errors import ApiError, InvalidParameter
from ..generated import v1
from ..models.manager import ModelManager
from ..settings import Settings
from .admission import Admission
from .prompts import Entry, check_ids, entries
from .results import Reply
from .scheduler import Scheduler, holding

LISTED = 16  # over-limit inputs named in the message, then "N more" (OAI-EMB-21)
DISABLED = (
    "`{model}` was loaded with GGUF_ENABLE_EMBEDDINGS=false and cannot embed; "
    "restart with GGUF_ENABLE_EMBEDDINGS=true."
)


def _inputs(raw: Any) -> tuple[list[Entry], bool]:
    """The inputs (strings or token-id tuples), and whether `input` was a single one (a
    string or one id list: `param` is then `input`, not `input[i]`)."""
    inputs, single = entries(raw, "input")
    empty = [i for i, value in enumerate(inputs) if value == ""]
    if empty:
        where = "input" if single else f"input[{empty[0]}]"
        raise InvalidParameter("input", f"{where} is an empty string: nothing to embed.")
    return inputs, single


def _too_long(counts: Sequence[int], limit: int, single: bool) -> ApiError:
    over = [(i, n) for i, n in enumerate(counts) if n > limit]
    named = ", ".join(f"input[{i}] ({n} tokens)" for i, n in over[:LISTED])
    more = f", and {len(over) - LISTED} more" if len(over) > LISTED else ""
    return ApiError(
        "context_length_exceeded",
        f"This model's maximum context length is {limit} tokens and inputs are never "
        f"truncated: {named}{more} exceed it. Shorten or split them.",
        "input" if single else f"input[{over[0][0]}]",
    )


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def _checked(vectors: np.ndarray, normalize: bool) -> np.ndarray:
    """Never NaN or infinity; a zero norm under `normalize` is the server's fault too."""
    for i, vector in enumerate(vectors):
        if not np.isfinite(vector).all():
            raise ApiError(
                "embedding_vector_invalid", f"The vector of input[{i}] is not finite.", None
            )
    if not normalize:
        return vectors
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    for i, norm in enumerate(norms):
        if norm == 0.0:
            raise ApiError(
                "embedding_vector_invalid",
                f"The vector of input[{i}] has norm 0 and cannot be normalised.",
                None,
            )
    scaled: np.ndarray = (vectors.astype(np.float64) / norms[:, None]).astype(np.float32)
    return scaled


class EmbeddingService:
    def __init__(
        self, settings: Settings, manager: ModelManager, scheduler: Scheduler, executor: Executor
    ) -> None:
        self._settings = settings
        self._manager = manager
        self._scheduler = scheduler
        self._executor = executor

    async def serve(self, req: v1.EmbeddingRequest, admission: Admission) -> Reply:
        """Embed every input in one batch, holding the slot (none is steered: SCORE-35)."""
        inputs, single = _inputs(req.input)
        cap = self._settings.embeddings_max_inputs
        if len(inputs) > cap:
            raise InvalidParameter(
                "input", f"input holds {len(inputs)} inputs; at most {cap} (EMBEDDINGS_MAX_INPUTS)."
            )
        entry = admission.entry
        headers = admission.headers((), self._settings.ignored_fields_header_max_bytes)
        if entry.engine == EngineId.LLAMACPP and not self._settings.gguf_enable_embeddings:
            raise InvalidParameter("model", DISABLED.format(model=entry.model_id))
        self._manager.refuse_if_busy()
        pooling = req.pooling or "mean"
        switch_timeout = self._settings.graceful_unload_timeout
        async with holding(self._manager, self._scheduler, entry, switch_timeout) as slot:
            engine = slot.engine
            if not isinstance(engine, Embedder):  # the field matrix refused it already
                raise InvalidParameter("model", f"`{entry.model_id}` does not embed.")
            vocab = engine.facts.vocab_size
            ids = [
                await self._ids(engine, value, vocab, single=single, i=i)
                for i, value in enumerate(inputs)
            ]
            limit = engine.embedding_limit
            if limit and any(len(i) > limit for i in ids):
                raise _too_long([len(i) for i in ids], limit, single)
            loop = asyncio.get_running_loop()
            try:
                vectors = await loop.run_in_executor(self._executor, engine.embed, ids, pooling)
            except EmbeddingsDisabled as exc:
                raise InvalidParameter("model", DISABLED.format(model=entry.model_id)) from exc
        vectors = _checked(np.asarray(vectors, dtype=np.float32), bool(req.normalize))
        fmt = req.encoding_format or "float"
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(vector, fmt)}
            for i, vector in enumerate(vectors)
        ]
        tokens = sum(len(i) for i in ids)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        body = {"object": "list", "data": data, "model": entry.model_id, "usage": usage}
        return Reply(body, headers)

    async def _ids(
        self, engine: Engine, value: Entry, vocab_size: int, *, single: bool, i: int
    ) -> list[int]:
        """Input i's ids: a string tokenized (special tokens added), ids as sent once
        each is within the vocabulary."""
        if isinstance(value, str):
            tokenize = partial(engine.tokenize, value, add_special_tokens=True)
            return await self._manager.with_tokenizer(tokenize)
        check_ids(value, "input" if single else f"input[{i}]", vocab_size)
        return list(value)
