"""Constrained decoding on llama.cpp: the shared grammars over the GGUF vocabulary.

llguidance reads the vocabulary from the loaded model (each token's bytes;
control tokens, and user-defined ones written `<...>`, marked special with a
leading 0xFF byte) and tokenizes grammar literals with llama.cpp's own
`llama_tokenize`, so masks and prompts agree token for token. This is
llguidance's `lltokenizer_from_vocab` on llama.cpp's current names (its own
calls deprecated ones). It is built once per model, on the first constrained
request (under a second for SmolLM2's 49152 tokens); every end-of-generation
token ends a document. The mask is written into the context's logits row
(`Context.pick`).
"""

from __future__ import annotations

import ctypes

import llama_cpp
import llguidance

from .. import grammar
from .context import Context, eog_ids

_PIECE_BYTES = 16 * 1024
_SPECIAL = b"\xff"


def _piece(
    vocab: llama_cpp.llama_vocab_p, token: int, buffer: ctypes.Array[ctypes.c_char]
) -> bytes:
    n = llama_cpp.llama_token_to_piece(vocab, token, buffer, _PIECE_BYTES, 0, True)
    if n < 0:
        raise ValueError(f"token {token} is longer than {_PIECE_BYTES} bytes")
    piece = ctypes.string_at(buffer, n)
    attr = llama_cpp.llama_vocab_get_attr(vocab, token)
    user_defined = attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
        user_defined and piece.startswith(b"<") and piece.endswith(b">")
    ):
        return _SPECIAL + piece
    return piece


def _lltokenizer(context: Context) -> llguidance.LLTokenizer:
    with context.lock:  # the vocabulary lives as long as the model: not while it closes
        vocab = context.vocab
        buffer = ctypes.create_string_buffer(_PIECE_BYTES + 1)
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        tokens = [_piece(vocab, token, buffer) for token in range(n_vocab)]
        tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined,no-any-return]
            tokens=tokens,
            vocab_ptr=vocab,
            tokenize_fptr=tokenize,
            eos_token=list(eog_ids(context.llama)),
            slices=None,
        )


def grammars(context: Context) -> grammar.Grammars:
    """The grammars of the model `context` holds (its tokenizer built on first use)."""
    return grammar.Grammars(lambda: _lltokenizer(context))
