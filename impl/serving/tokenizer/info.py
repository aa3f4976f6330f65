"""What a model's tokenizer is (GET /v1/tokenizer_info): vLLM's `TokenizerInfoResponse`,
cut to what each engine can say truthfully.

    field              transformers                     llama.cpp
    tokenizer_class    the tokenizer's class name       the GGUF's `tokenizer.ggml.model`
    bos/eos/pad/unk    the tokenizer's own, as text     the vocabulary's, as text
    model_max_length,  the context window served        the same
    max_model_len
    vocab_size         the ids the model scores         the same
    chat_template      the model's own, or null         the same

A special token the tokenizer does not name is left out, never null. Each engine's
reader is keyed by its id (`READERS`); a model the registry knows always has one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...engines import gguf
from ...engines.base import Engine, EngineId
from ...engines.llamacpp import LlamaCppEngine
from ...models.registry import ModelEntry

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
UNRECORDED = "unrecorded"

Reader = Callable[[Engine, ModelEntry], tuple[str, Mapping[str, str]]]


def _transformers(engine: Engine, _entry: ModelEntry) -> tuple[str, Mapping[str, str]]:
    from ...engines.transformers import TransformersEngine  # imported by the engine's load

    assert isinstance(engine, TransformersEngine)
    tokenizer = engine.tokenizer
    named = {name: getattr(tokenizer, name, None) for name in SPECIAL}
    return type(tokenizer).__name__, {k: str(v) for k, v in named.items() if v is not None}


def _llamacpp(engine: Engine, entry: ModelEntry) -> tuple[str, Mapping[str, str]]:
    assert isinstance(engine, LlamaCppEngine)
    try:
        model = gguf.facts(entry.path).metadata.get("tokenizer.ggml.model")
    except (OSError, gguf.NotGGUF):
        model = None
    special = engine.template.special_tokens
    tokens = {name: special[name] for name in SPECIAL if special.get(name)}
    return (model if isinstance(model, str) else UNRECORDED), tokens


READERS: dict[EngineId, Reader] = {
    EngineId.TRANSFORMERS: _transformers,
    EngineId.LLAMACPP: _llamacpp,
}


def described(engine: Engine, entry: ModelEntry) -> dict[str, Any]:
    """The body of GET /v1/tokenizer_info for `entry`, served by `engine`."""
    facts = engine.facts
    tokenizer_class, tokens = READERS[entry.engine](engine, entry)
    return {
        "model": entry.model_id,
        "tokenizer_class": tokenizer_class,
        "model_max_length": facts.context_length,
        "max_model_len": facts.context_length,
        "vocab_size": facts.vocab_size,
        **tokens,
        "chat_template": engine.chat_template,
    }
