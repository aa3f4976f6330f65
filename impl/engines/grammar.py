"""Constrained decoding with llguidance, for every engine: compilers, cache, token mask.

`Grammars` wraps a model's vocabulary for llguidance once, on the first
constrained request (the engine supplies how: from a Hugging Face tokenizer,
or from llama.cpp's vocabulary). Each constraint compiles once into a
matcher kept as a template (LRU by text); every choice gets its own deep
copy (a `Guide`), so `n` > 1 and batched rows are constrained separately
(OAI-SO-18).

Two kinds compile (`base.Constraint`): `json_schema`, and `call` (a forced
tool call's continuation: one option's head, a JSON document under its
schema, then the tail). JSON is written with fixed separators (`", "`,
`": "`) and no free whitespace, so a model cannot spend its budget on blank
lines inside a document.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import llguidance
import numpy as np
import numpy.typing as npt

from .base import Constraint, ConstraintUnsupported, SamplingParams
from .thinking import Budget

_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_COMPILERS: dict[str, Callable[[str], str]] = {
    "json_schema": lambda text: llguidance.LLMatcher.grammar_from_json_schema(
        json.loads(text),
        overrides=_OPTIONS,  # type: ignore[arg-type]
    ),
    "call": lambda text: llguidance.LLMatcher.grammar_from_lark(call_lark(json.loads(text))),
}


def call_lark(call: dict[str, Any]) -> str:
    """Lark for `head_i JSON(schema_i) tail`: one rule per option, schemas as `%json`."""
    tail = json.dumps(call["tail"], ensure_ascii=False)
    rules = []
    for i, (head, schema) in enumerate(call["options"]):
        options = dict(schema) | {"x-guidance": _OPTIONS}
        rules.append(f"c{i}: {json.dumps(head, ensure_ascii=False)} a{i} {tail}")
        rules.append(f"a{i}: %json {json.dumps(options, ensure_ascii=False)}")
    alternatives = " | ".join(f"c{i}" for i in range(len(call["options"])))
    return "\n".join([f"start: {alternatives}", *rules]) + "\n"


class Mask(Protocol):
    """What masks one choice's logits each step and follows the token picked: a grammar's
    `Guide`, or a thinking budget (engines/thinking.py)."""

    def mask_row(self, logits: npt.NDArray[np.float32]) -> None: ...

    def advance(self, token_id: int) -> None: ...


class Guide:
    """One choice's grammar state: which tokens may come next; advanced by each token."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def allowed(self, width: int) -> npt.NDArray[np.bool_]:
        """Which of the first `width` token ids the grammar allows now (ids past the
        grammar's vocabulary never are); raises when it allows none."""
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little")[:width].view(np.bool_)
        if not bits.any():
            raise RuntimeError(f"the grammar allows no token: {self._matcher.get_error()}")
        if bits.shape[0] < width:
            bits = np.concatenate([bits, np.zeros(width - bits.shape[0], dtype=np.bool_)])
        return bits

    def mask_row(self, logits: npt.NDArray[np.float32]) -> None:
        """Set every logit the grammar forbids to -inf, in place (one row over the vocabulary)."""
        logits[~self.allowed(logits.shape[0])] = -np.inf

    def advance(self, token_id: int) -> None:
        """Consume the sampled token; a token the mask allowed is always accepted."""
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}: {self._matcher.get_error()}")


class Grammars:
    """llguidance over one model's vocabulary; compiled grammars kept per constraint (LRU).

    `tokenizer` builds the llguidance tokenizer (about a second); it is called
    once, on the first compile.
    """

    def __init__(self, tokenizer: Callable[[], llguidance.LLTokenizer], size: int = 64) -> None:
        self._make_tokenizer = tokenizer
        self._size = size
        self._ll: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def _lltokenizer(self) -> llguidance.LLTokenizer:
        if self._ll is None:
            self._ll = self._make_tokenizer()
        return self._ll

    def compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        """The template matcher of `constraint`; raises ConstraintUnsupported."""
        key = (constraint.kind, constraint.text)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                return template
            template = self._build(constraint)
            self._compiled[key] = template
            if len(self._compiled) > self._size:
                self._compiled.popitem(last=False)
            return template

    def _build(self, constraint: Constraint) -> llguidance.LLMatcher:
        try:
            grammar = _COMPILERS[constraint.kind](constraint.text)
        except ValueError as exc:
            raise ConstraintUnsupported(str(exc)) from exc
        matcher = llguidance.LLMatcher(self._lltokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ConstraintUnsupported(matcher.get_error())
        return matcher

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for one choice (a copy of the compiled template)."""
        return self.compile(constraint).deep_copy()

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh grammar state for one choice."""
        return Guide(self.matcher(constraint))

    def mask(self, params: SamplingParams, decode: Callable[[Sequence[int]], str]) -> Mask | None:
        """One choice's mask: its grammar's, else its thinking budget's, else none."""
        if params.constraint is not None:
            return self.guide(params.constraint)
        return None if params.thinking is None else Budget(params.thinking, decode)
