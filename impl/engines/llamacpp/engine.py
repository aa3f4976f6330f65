"""`LlamaCppEngine`: the Engine protocol over a GGUF file on llama-cpp-python."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Generator, Iterable, Sequence
from functools import partial
from typing import Any

import llama_cpp

from ..base import (
    NO_HOOKS,
    BatchRow,
    Capability,
    Capture,
    ChatPrompt,
    Constraint,
    Decision,
    EmbeddingsDisabled,
    Hooks,
    Joiner,
    ModelFacts,
    Prefilled,
    Rng,
    SamplingParams,
    Scored,
    ScoreQuery,
    Token,
)
from ..capabilities import capabilities_of
from ..chatmessages import decision_prompt, prefix_length
from ..grammar import Grammars
from ..prompt_cache import PromptCache
from ..rows import PREFILL_CHUNK, RowsBatchBase
from . import chat, deciding, embedding, grammar
from .batch import Joining, Row, Rows
from .context import Context
from .deciding import KeptPrefix
from .decoding import check_ids, decode
from .sampling import Seeds, new_rng
from .tap import Observer

logger = logging.getLogger(__name__)


class LlamaCppEngine:
    """A GGUF model in one llama.cpp context, whose KV cache is kept across requests: a
    `Scorer`, `Decider`, `Embedder`, `Constrainer`, `Steerable` and `Inspectable`
    (engines/capabilities.py). A generation's steering runs as the context's control vector
    (steering.py); its monitor and capture read layers through the context's evaluation
    callback (tap.py)."""

    scoring_precisions = frozenset({"native"})  # no float32 copy of a quantized model (OAI-F32)

    def __init__(
        self,
        llama: llama_cpp.Llama,
        facts: ModelFacts,
        template: chat.ChatTemplate,
        *,
        embeddings: bool = True,
        parallel: int = 1,
        cache: PromptCache | None = None,
        chunk: int = PREFILL_CHUNK,
    ):
        self._cache = cache
        self._context: Context | None = Context(llama, cache)
        self._batch: RowsBatch | None = None
        if parallel > 1:
            window = int(llama.n_ctx()) // parallel  # the rows share the serial window's KV
            self._batch = RowsBatch(self, Rows(llama, parallel, window, cache, chunk))
        self._grammars: Grammars | None = grammar.grammars(self._context)
        self._embeddings = embeddings
        self._facts = facts
        self._template = template
        self._kept: KeptPrefix | None = None  # the saved decide prefix state (deciding.py)

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    @property
    def capabilities(self) -> frozenset[Capability]:
        return CAPABILITIES

    @property
    def context(self) -> Context:
        """The llama.cpp context (for tests and tools); fails once closed."""
        if self._context is None:
            raise RuntimeError(f"engine for {self._facts.model_id} is closed")
        return self._context

    @property
    def batch(self) -> RowsBatch | None:
        """Rows decoded together on their own context (loaded with `parallel` > 1)."""
        return self._batch

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The prompt states kept across requests (engines/prompt_cache.py), None when off."""
        return self._cache

    @property
    def template(self) -> chat.ChatTemplate:
        return self._template

    @property
    def steerable_layers(self) -> range:
        """Layers 1..n-1: llama.cpp's control vector has no slot for layer 0 (steering.py)."""
        return range(1, self._facts.n_layers)

    @property
    def readable_layers(self) -> range:
        """Every layer: the tap reads any layer's `l_out` (tap.py)."""
        return range(self._facts.n_layers)

    def user_span(self, prompt: ChatPrompt) -> tuple[int, int] | None:
        return chat.user_span(self._template, self._tokenize_rendered, prompt)

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; special-token text becomes special tokens (as in transformers)."""
        llama = self.context.llama
        return list(llama.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True))

    def decode(self, token_ids: Sequence[int], *, keep_special: bool = False) -> str:
        """Text of `token_ids`, special tokens left out unless `keep_special`; a cut UTF-8
        tail shows U+FFFD."""
        return self._detokenize(token_ids, keep_special).decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return self._template.source

    def _detokenize(self, token_ids: Sequence[int], keep_special: bool = False) -> bytes:
        vocab = self.context.vocab  # fails once closed, before the vocabulary is freed
        count = len(token_ids)
        if count == 0:
            return b""
        check_ids(token_ids, self._facts.vocab_size)
        ids = (llama_cpp.llama_token * count)(*token_ids)
        size = 8 * count + 16
        for _ in range(2):
            buffer = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(vocab, ids, count, buffer, size, False, keep_special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n
        raise RuntimeError("llama_detokenize did not fit its own size")

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], keep_special=True)

    def render_chat(self, prompt: ChatPrompt) -> list[int]:
        return chat.render_chat(self._template, self._tokenize_rendered, prompt)

    def _tokenize_rendered(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenize(text, add_special_tokens=add_special_tokens)

    def new_rng(self, seed: int | None) -> Rng | None:
        return new_rng(seed)

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: Rng | None,
        hooks: Hooks = NO_HOOKS,
    ) -> Generator[Prefilled | Token, None, None]:
        """A seeded `rng` (from `new_rng`) gives each choice the next seed and a full prefill;
        a constraint masks every step with a fresh grammar state; every pass runs under the
        hooks' steering and feeds their monitor and capture."""
        if rng is not None and not isinstance(rng, Seeds):
            raise TypeError("rng must come from this engine's new_rng")
        self.check_hooks(hooks)
        guide = self.grammars.mask(params, self.decode)
        seed = None if rng is None else rng.next()
        return decode(self.context, prompt_ids, params, seed=seed, guide=guide, hooks=hooks)

    def check_hooks(self, hooks: Hooks) -> None:
        """Refuse what this engine cannot run (ValueError): a steering layer outside
        `steerable_layers` (the control vector has no slot for layer 0), a layer to read
        outside `readable_layers`."""
        last = self._facts.n_layers - 1
        steered = () if hooks.steering is None else hooks.steering.layers()
        bad = _outside(steered, self.steerable_layers)
        if bad is not None:
            raise ValueError(
                f"llama.cpp steers layers 1..{last} (its control vector has no slot for layer "
                f"0), not layer {bad}"
            )
        observer = Observer.of(hooks)
        bad = _outside(() if observer is None else observer.layers, self.readable_layers)
        if bad is not None:
            raise ValueError(f"layer {bad} is outside 0..{last}")

    def score(
        self, prompt_ids: Sequence[int], query: ScoreQuery, capture: Capture | None = None
    ) -> Scored:
        """One pass over the whole prompt, unsteered (OAI-SCORE-33), read by `capture`
        (recorded on it)."""
        if query.precision != "native":
            raise ValueError("the llama.cpp engine scores at its native precision only")
        check_ids(prompt_ids, self._facts.vocab_size)
        hooks = Hooks(capture=capture)
        self.check_hooks(hooks)
        observer = Observer.of(hooks)
        try:
            return self.context.score(prompt_ids, query, observer)
        finally:
            if observer is not None:
                observer.record()

    @property
    def grammars(self) -> Grammars:
        """llguidance over this model's vocabulary; fails once closed."""
        if self._grammars is None:
            raise RuntimeError(f"engine for {self._facts.model_id} is closed")
        return self._grammars

    def compile_constraint(self, constraint: Constraint) -> None:
        self.grammars.compile(constraint)  # fails once closed, before the vocabulary is freed

    @property
    def embedding_limit(self) -> int:
        """Most tokens one input may hold: min(context window, batch size) (OAI-EMB-19)."""
        return embedding.limit(self.context)

    def embed(self, inputs: Sequence[Sequence[int]], pooling: str) -> Any:
        """Mean-pooled vectors (GGUF models are loaded with mean pooling only)."""
        if pooling != "mean":
            raise ValueError(f"llama.cpp serves mean pooling only, not {pooling!r}")
        if not self._embeddings:
            raise EmbeddingsDisabled("GGUF_ENABLE_EMBEDDINGS=false: loaded unable to embed")
        for ids in inputs:
            check_ids(ids, self._facts.vocab_size)
        return embedding.embed(self.context, inputs)

    def render_split(self, prefix: str, suffix: str) -> tuple[list[int], int]:
        text = chat.render_text(self._template, decision_prompt(prefix, suffix))
        ids = chat.tokenize_rendered(self._template, self._tokenize_rendered, text)
        head = partial(chat.tokenize_rendered, self._template, self._tokenize_rendered)
        return ids, prefix_length(text, ids, prefix, suffix, tokenize=head)

    def prefill_choices(
        self,
        prompt_ids: Sequence[int],
        prefix_length: int,
        choice_ids: Sequence[int],
        *,
        reuse: bool,
        cancel: Any,
    ) -> Decision:
        check_ids(prompt_ids, self._facts.vocab_size)
        decision, self._kept = deciding.prefill_choices(
            self.context,
            self._kept,
            prompt_ids,
            prefix_length,
            choice_ids=choice_ids,
            reuse=reuse,
            cancel=cancel,
        )
        return decision

    def close(self) -> None:
        """Free the model and its context; a later call that needs them fails."""
        if self._context is None:
            return
        context, self._context = self._context, None
        self._kept = None
        if self._batch is not None:
            self._batch.close()
        self._grammars = None
        if self._cache is not None:
            self._cache.clear()
        context.close()
        logger.info("closed llama.cpp engine for %s", self._facts.model_id)


class RowsBatch(RowsBatchBase[Rows, Row]):
    """The engine's `Batch`: `Rows`, with a request's constraint and seed made as the serial
    path makes them."""

    def __init__(self, engine: LlamaCppEngine, rows: Rows) -> None:
        super().__init__(rows, Row)
        self._engine = engine

    @property
    def tapped(self) -> bool:
        """Whether the batch's context carries the tap yet (a monitored row has joined)."""
        return self._rows.tapped

    def join(self, joiner: Joiner) -> Row:
        """`join_all` of one: the sequence stays free if the prefill fails."""
        [row] = self._rows.join_all([self._joining(joiner)])
        return row

    def join_all(self, joiners: Sequence[Joiner]) -> list[BatchRow | Exception]:
        """Each joiner checked as `join` checks it (a refusal is that joiner's alone), then
        the others prefilled together (`Rows.join_all`); a failed prefill is all of theirs."""
        joined: dict[int, BatchRow | Exception] = {}
        ready: dict[int, Joining] = {}
        for i, joiner in enumerate(joiners):
            try:
                ready[i] = self._joining(joiner)
            except Exception as exc:  # this prompt's fault: this row only
                joined[i] = exc
        if ready:
            try:
                rows = self._rows.join_all(list(ready.values()))
            except Exception as exc:  # the prefill's fault: every row that joined with it
                joined.update(dict.fromkeys(ready, exc))
            else:
                joined.update(zip(ready, rows, strict=True))
        return [joined[i] for i in range(len(joiners))]

    def _joining(self, joiner: Joiner) -> Joining:
        """What `Rows` takes for a joiner: its grammar, seed and steering as the serial path
        makes them; refused if it has hooks the engine cannot run, or holds an id out of the
        vocabulary."""
        self._engine.check_hooks(joiner.hooks)
        if joiner.hooks.capture is not None:
            raise ValueError("a row captures no layer: readings run on the serial path")
        if joiner.params.prompt_logprobs is not None:
            raise ValueError("a row reports no prompt logprobs: echo runs on the serial path")
        rng = joiner.rng
        if rng is not None and not isinstance(rng, Seeds):
            raise TypeError("rng must come from this engine's new_rng")
        check_ids(joiner.prompt_ids, self._engine.facts.vocab_size)
        guide = self._engine.grammars.mask(joiner.params, self._engine.decode)
        seed = None if rng is None else rng.next()
        hooks = joiner.hooks
        return Joining(joiner.prompt_ids, joiner.params, seed, guide, hooks.steering, hooks.monitor)


CAPABILITIES = capabilities_of(LlamaCppEngine)  # every protocol it implements


def _outside(layers: Iterable[int], allowed: range) -> int | None:
    """The lowest of `layers` not in `allowed`, or None."""
    return min((layer for layer in layers if layer not in allowed), default=None)
