"""Constrained decoding with llguidance: one tokenizer per model, grammars cached by text.

`Grammars` wraps the model's tokenizer for llguidance once (about half a
second), on the first constrained request. Each schema compiles once into a
matcher kept as a template; every choice gets its own deep copy (a `Guide`),
so `n` > 1 and batched rows are constrained separately (OAI-SO-18/19).

The mask is applied with plain torch: llguidance's own helper is
`torch.compile`d and costs seconds on its first CPU call. JSON is written
with fixed separators (`", "`, `": "`) and no free whitespace, so a model
cannot spend its budget on blank lines inside a document.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import llguidance
import llguidance.hf
import torch
from transformers import PreTrainedTokenizerBase

from ..base import Constraint, ConstraintUnsupported

_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_SHIFTS = torch.arange(32, dtype=torch.int32)
_COMPILERS: dict[str, Callable[[str], str]] = {
    "json_schema": lambda text: llguidance.LLMatcher.grammar_from_json_schema(
        json.loads(text),
        overrides=_OPTIONS,  # type: ignore[arg-type]
    ),
    "call": lambda text: llguidance.LLMatcher.grammar_from_lark(_call_lark(json.loads(text))),
}


def _call_lark(call: dict[str, Any]) -> str:
    """Lark for `head_i JSON(schema_i) tail`: one rule per option, schemas as `%json`."""
    tail = json.dumps(call["tail"], ensure_ascii=False)
    rules = []
    for i, (head, schema) in enumerate(call["options"]):
        options = dict(schema) | {"x-guidance": _OPTIONS}
        rules.append(f"c{i}: {json.dumps(head, ensure_ascii=False)} a{i} {tail}")
        rules.append(f"a{i}: %json {json.dumps(options, ensure_ascii=False)}")
    alternatives = " | ".join(f"c{i}" for i in range(len(call["options"])))
    return "\n".join([f"start: {alternatives}", *rules]) + "\n"


class Guide:
    """One choice's grammar state: masks logits, then advances by the sampled token."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` (1-D) with every token the grammar forbids set to -inf."""
        words = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.int32)
        allowed = ((words.unsqueeze(1) >> _SHIFTS) & 1).flatten().bool()
        if not bool(allowed.any()):
            raise RuntimeError(f"the grammar allows no token: {self._matcher.get_error()}")
        n = min(logits.shape[0], allowed.shape[0])
        keep = torch.zeros(logits.shape[0], dtype=torch.bool)
        keep[:n] = allowed[:n]
        return logits.masked_fill(~keep, float("-inf"))

    def advance(self, token_id: int) -> None:
        """Consume the sampled token; a token the mask allowed is always accepted."""
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}: {self._matcher.get_error()}")


class Grammars:
    """llguidance over one model's tokenizer; compiled grammars kept per schema (LRU)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eos_ids: frozenset[int],
        width: int,
        size: int = 64,
    ) -> None:
        self._tokenizer = tokenizer
        self._eos = sorted(eos_ids)
        self._width = max(width, len(tokenizer))
        self._size = size
        self._ll: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def _lltokenizer(self) -> llguidance.LLTokenizer:
        if self._ll is None:
            self._ll = llguidance.hf.from_tokenizer(
                self._tokenizer,  # type: ignore[arg-type]
                n_vocab=self._width,
                eos_token=self._eos,
            )
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

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh grammar state for one choice."""
        return Guide(self.compile(constraint).deep_copy())
