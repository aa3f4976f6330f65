"""Loading a `LlamaCppEngine` from a GGUF file."""

from __future__ import annotations

import logging
from pathlib import Path

import llama_cpp

from .. import gguf
from ..base import DEFAULT_LOAD, ENGINE_NAMES, EngineId, LoadOptions, ModelFacts
from ..cores import usable_cores
from ..prompt_cache import prompt_cache
from ..rows import chunk_of, parallel_of
from .chat import ChatTemplate
from .context import eog_ids
from .engine import LlamaCppEngine

logger = logging.getLogger(__name__)

UNRECORDED = "unrecorded"
_METADATA_TOKENS = {
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


LLAMA_DEFAULT_BATCH = 512  # llama-cpp-python's own n_batch


def load_llamacpp_engine(
    path: Path,
    *,
    model_id: str,
    options: LoadOptions = DEFAULT_LOAD,
    owned_by: str = "local",
    embeddings: bool = True,
) -> LlamaCppEngine:
    """Load the GGUF file at `path` on llama.cpp: on the CPU, with `options.n_gpu_layers`
    offloaded to a GPU when this build of llama-cpp-python has a GPU backend
    (`gpu_offload`; the config turns the setting off on a CPU build, local/config.py).

    `options.ctx_size` 0 uses the context length the file was trained with
    (a larger one is cut to it); `threads` is the thread count for both prefill
    and decode, 0 the physical cores this process may use (`..cores`); `batch_size` 0
    keeps its n_batch; `mmap`, `mlock` as llama.cpp's. `dtype` is transformers'
    and changes nothing here. A file that is not GGUF raises `gguf.NotGGUF`,
    one llama.cpp cannot load raises its `ValueError`.
    """
    header = gguf.facts(path)
    logger.info("loading %s from %s on llama.cpp", model_id, path)
    n_ctx = min(options.ctx_size, header.context_length) or header.context_length
    llama = _open_llama(path, n_ctx, options, embeddings=embeddings)
    facts = _model_facts(llama, header, path, model_id=model_id, owned_by=owned_by)
    logger.info(
        "loaded %s (%s@%s, n_ctx %d)",
        model_id,
        facts.quantization,
        facts.revision,
        facts.context_length,
    )
    template = chat_template(llama, header)
    parallel = parallel_of(options.parallel, facts.context_length)
    cache = prompt_cache(options.cache_ram)
    return LlamaCppEngine(
        llama,
        facts,
        template,
        embeddings=embeddings,
        parallel=parallel,
        cache=cache,
        chunk=chunk_of(options.prefill_chunk),
    )


def gpu_offload() -> bool:
    """Whether this build of llama-cpp-python can offload layers to a GPU (the PyPI wheel
    cannot: CMAKE_ARGS="-DGGML_CUDA=on" pip install llama-cpp-python builds one that can)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def _open_llama(
    path: Path, n_ctx: int, options: LoadOptions, *, embeddings: bool
) -> llama_cpp.Llama:
    """The model at `path` on a context of `n_ctx` tokens, set up as `options` ask."""
    threads = options.threads or usable_cores()

    def open_llama(flash_attn: bool) -> llama_cpp.Llama:
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            use_mmap=options.mmap,
            use_mlock=options.mlock,
            n_batch=options.batch_size or LLAMA_DEFAULT_BATCH,
            n_gpu_layers=options.n_gpu_layers if gpu_offload() else 0,
            logits_all=False,
            flash_attn=flash_attn,
            verbose=False,
            pooling_type=(
                llama_cpp.LLAMA_POOLING_TYPE_MEAN
                if embeddings
                else llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
            ),
        )

    try:
        return open_llama(flash_attn=True)  # llama-server's `-fa auto` turns it on on a CPU
    except ValueError:  # a model whose attention the flash kernel cannot run
        logger.warning("flash attention refused for %s: loading without it", path.name)
        return open_llama(flash_attn=False)


def _model_facts(
    llama: llama_cpp.Llama,
    header: gguf.GGUFFacts,
    path: Path,
    *,
    model_id: str,
    owned_by: str,
) -> ModelFacts:
    """What the loaded model says about itself (ModelFacts)."""
    return ModelFacts(
        model_id=model_id,
        engine=ENGINE_NAMES[EngineId.LLAMACPP],
        context_length=int(llama.n_ctx()),
        vocab_size=int(llama.n_vocab()),
        dtype=UNRECORDED,  # llama.cpp computes from quantized blocks: no one dtype to name
        quantization=header.quantization,
        revision=gguf.fingerprint(path)[:8],
        owned_by=owned_by,
        has_chat_template=header.chat_template is not None,
        threads=int(llama.n_threads),
        device="gpu" if gpu_offload() and llama.model_params.n_gpu_layers else "cpu",
        eog_ids=eog_ids(llama),
        d_model=int(llama.n_embd()),
        n_layers=int(llama_cpp.llama_model_n_layer(llama.model)),
    )


def chat_template(llama: llama_cpp.Llama, header: gguf.GGUFFacts) -> ChatTemplate:
    """The file's chat template and the special tokens it may write, as text."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    ids = {
        "bos_token": int(llama_cpp.llama_vocab_bos(vocab)),
        "eos_token": int(llama_cpp.llama_vocab_eos(vocab)),
    }
    for name, key in _METADATA_TOKENS.items():
        value = header.metadata.get(key)
        if isinstance(value, int):
            ids[name] = value
    n_vocab = int(llama.n_vocab())
    special = {
        name: _token_text(vocab, token_id)
        for name, token_id in ids.items()
        if 0 <= token_id < n_vocab
    }
    bos_id = ids["bos_token"] if "bos_token" in special else None
    return ChatTemplate(source=header.chat_template, special_tokens=special, bos_token_id=bos_id)


def _token_text(vocab: llama_cpp.llama_vocab_p, token_id: int) -> str:
    raw: bytes = llama_cpp.llama_vocab_get_text(vocab, token_id)
    return raw.decode("utf-8", errors="replace")
