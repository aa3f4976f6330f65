"""`TransformersEngine`: the Engine protocol over a Hugging Face model."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..base import (
    NO_HOOKS,
    BatchRow,
    Capability,
    Capture,
    ChatPrompt,
    Constraint,
    Decision,
    Hooks,
    Joiner,
    ModelFacts,
    Prefilled,
    Rng,
    SamplingParams,
    Scored,
    ScoreQuery,
    SteeringSource,
    Token,
)
from ..capabilities import ENCODER, capabilities_of
from ..chatmessages import decision_prompt, prefix_length
from ..monitor import Monitor
from ..prompt_cache import PromptCache
from ..rows import PREFILL_CHUNK, RowsBatchBase
from . import chat, deciding, embedding
from .batch import Row, Rows
from .capture import Residuals, captured, monitored
from .decoding import DecodeSettings, decode, decode_settings
from .float32 import Float32Copies, Float32Settings
from .grammar import Grammars
from .prefix import PrefixCache, batchable
from .sampling import new_rng
from .scoring import score_kept, score_pass
from .steering import steered

logger = logging.getLogger(__name__)


class TransformersEngine:
    """A loaded causal LM and its tokenizer, on torch (CPU), with one kept KV cache: every
    optional protocol of engines/capabilities.py."""

    scoring_precisions = frozenset({"native", "float32"})

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        facts: ModelFacts,
        eos_ids: frozenset[int],
        *,
        float32: Float32Settings | None = None,
        capabilities: frozenset[Capability] | None = None,
        parallel: int = 1,
        cache: PromptCache | None = None,
        chunk: int = PREFILL_CHUNK,
    ) -> None:
        model.eval()  # type: ignore[no-untyped-call]
        self._model: PreTrainedModel | None = model
        self._tokenizer = tokenizer
        self._facts = facts
        self._settings: DecodeSettings = decode_settings(model, eos_ids)
        self._cache = cache
        self._prefix = PrefixCache(model.config, cache, model.device)
        self._decisions = PrefixCache(model.config)  # the kept decide prefix (deciding.py)
        self._steering_key: Hashable = ()
        self._capturing = 0  # captures open (capturing()): no prefix reuse meanwhile
        self._float32 = Float32Copies(float32 or Float32Settings())
        # An encoder is loaded with fewer (it only embeds) than the class implements.
        self._capabilities = CAPABILITIES if capabilities is None else capabilities
        width = int(getattr(model.config, "vocab_size", 0) or 0)
        self._grammars = Grammars(tokenizer, self._settings.eos_ids, width)
        self._batch: RowsBatch | None = None
        if parallel > 1 and batchable(model.config):
            rows = Rows(model, self._settings, parallel, facts.context_length, cache, chunk)
            self._batch = RowsBatch(rows, self._grammars, self.decode)
        elif parallel > 1:
            logger.info("%s has sliding or recurrent layers: serial only", facts.model_id)

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self._capabilities

    @property
    def model(self) -> PreTrainedModel:
        """The loaded model (for hooks and tests); fails once closed."""
        if self._model is None:
            raise RuntimeError(f"engine for {self._facts.model_id} is closed")
        return self._model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return self._settings.eos_ids

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return ids

    def decode(self, token_ids: Sequence[int], *, keep_special: bool = False) -> str:
        text = self._tokenizer.decode(list(token_ids), skip_special_tokens=not keep_special)
        return cast(str, text)

    @property
    def chat_template(self) -> str | None:
        template = self._tokenizer.chat_template
        return template if isinstance(template, str) and template else None

    def token_text(self, token_id: int) -> str:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return cast(str, text)

    def render_chat(self, prompt: ChatPrompt) -> list[int]:
        return chat.render_chat(self._tokenizer, prompt)

    def user_span(self, prompt: ChatPrompt) -> tuple[int, int] | None:
        return chat.user_span(self._tokenizer, prompt)

    def new_rng(self, seed: int | None) -> Rng | None:
        return new_rng(seed)

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: Rng | None,
        hooks: Hooks = NO_HOOKS,
    ) -> Generator[Prefilled | Token, None, None]:
        if rng is not None and not isinstance(rng, torch.Generator):
            raise TypeError("rng must come from this engine's new_rng")
        guide = self._grammars.mask(params, self.decode)
        return self._hooked(hooks, prompt_ids, params, rng, guide)

    def _hooked(
        self,
        hooks: Hooks,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: torch.Generator | None,
        guide: Any,
    ) -> Generator[Prefilled | Token, None, None]:
        """The generation with its hooks entered as it starts and left before it ends."""
        with self._entered(hooks):
            yield from decode(
                self.model,
                self._settings,
                self._prefix,
                prompt_ids,
                params=params,
                rng=rng,
                key=self._steering_key,
                guide=guide,
                reuse=self._capturing == 0,
            )

    @contextmanager
    def _entered(self, hooks: Hooks) -> Iterator[None]:
        """`hooks` for a block: the steering first, so a post-steering capture reads after
        its delta; a capture's rows recorded as the block ends."""
        with ExitStack() as stack:
            if hooks.steering is not None:
                stack.enter_context(self.steered(hooks.steering))
            if hooks.monitor is not None:
                stack.enter_context(self.monitoring(hooks.monitor))
            capture = hooks.capture
            if capture is not None:
                read = self.capturing(capture.layer, pre_steering=capture.pre_steering)
                residuals = stack.enter_context(read)
                stack.callback(lambda: capture.record(residuals.rows()))
            yield

    def compile_constraint(self, constraint: Constraint) -> None:
        self._grammars.compile(constraint)

    def score(
        self, prompt_ids: Sequence[int], query: ScoreQuery, capture: Capture | None = None
    ) -> Scored:
        """One forward pass, no steering hook (OAI-SCORE-11), on the kept KV unless a capture
        reads, echo asks every position or a float32 copy scores (scoring.py)."""
        if capture is not None:
            with self.capturing(capture.layer, pre_steering=capture.pre_steering) as residuals:
                result = self.score(prompt_ids, query)
            capture.record(residuals.rows())
            return result
        keeps = self._settings.keeps_last_logits
        reusable = query.reuse and query.prompt_logprobs is None and not self._capturing
        if query.precision != "float32" and reusable:
            return score_kept(self.model, self._prefix, prompt_ids, query, keeps)
        if query.precision != "float32":
            return score_pass(self.model, prompt_ids, query, keeps)
        with self._float32.model(self.model) as model:
            return score_pass(model, prompt_ids, query, keeps)

    @property
    def embedding_limit(self) -> int:
        """The served context window (0: the model states none, OAI-EMB-19)."""
        return self._facts.context_length

    def embed(self, inputs: Sequence[Sequence[int]], pooling: str) -> Any:
        pad = self._tokenizer.pad_token_id
        if pad is None:
            pad = self._tokenizer.eos_token_id if self._tokenizer.eos_token_id is not None else 0
        return embedding.embed(self.model, inputs, pooling, int(pad))

    def render_split(self, prefix: str, suffix: str) -> tuple[list[int], int]:
        text = chat.render_text(self._tokenizer, decision_prompt(prefix, suffix))
        ids = chat.tokenize_rendered(self._tokenizer, text)
        head = partial(chat.tokenize_rendered, self._tokenizer)
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
        return deciding.prefill_choices(
            self.model,
            self._decisions,
            prompt_ids,
            prefix_length,
            choice_ids=choice_ids,
            reuse=reuse,
            cancel=cancel,
            keeps_last=self._settings.keeps_last_logits,
        )

    @property
    def batch(self) -> RowsBatch | None:
        """Rows decoded together on one padded cache (loaded with `parallel` > 1)."""
        return self._batch

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The prompt states kept across requests (prefix.py), None when off."""
        return self._cache

    @property
    def steerable_layers(self) -> range:
        """Every decoder layer: a hook adds at any of them (steering.py)."""
        return range(self._facts.n_layers)

    @property
    def readable_layers(self) -> range:
        """Every decoder layer: a hook reads any of them (capture.py)."""
        return range(self._facts.n_layers)

    @contextmanager
    def steered(self, source: SteeringSource) -> Iterator[None]:
        """Generations started inside the block are steered; the KV prefix is kept per state.

        A kept prefix filled while the state changed mid-generation mixes two
        states' keys and values, so it is dropped.
        """
        previous, self._steering_key = self._steering_key, source.key()
        try:
            with steered(self.model, source):
                yield
        finally:
            self._steering_key = previous
            if source.mixed():
                self._prefix.close_kept()

    @contextmanager
    def capturing(self, layer: int, *, pre_steering: bool) -> Iterator[Residuals]:
        """Layer `layer`'s output rows of the generations run inside the block
        (capture.py), which reuse no kept prefix; post steering, enter it inside
        `steered()`."""
        with captured(self.model, layer, pre_steering=pre_steering) as residuals:
            self._capturing += 1
            try:
                yield residuals
            finally:
                self._capturing -= 1

    @contextmanager
    def monitoring(self, monitor: Monitor) -> Iterator[None]:
        """The generations run inside the block feed `monitor` (capture.monitored), before
        each layer's steering delta, and reuse no kept prefix."""
        with monitored(self.model, monitor):
            self._capturing += 1
            try:
                yield
            finally:
                self._capturing -= 1

    def close(self) -> None:
        """Drop the model and the kept KV caches; a later call that needs the model fails."""
        self._prefix.close()
        self._decisions.close()
        if self._batch is not None:
            self._batch.close()
        if self._cache is not None:
            self._cache.clear()
        self._model = None
        gc.collect()
        logger.info("closed transformers engine for %s", self._facts.model_id)


CAPABILITIES = capabilities_of(TransformersEngine)  # every protocol it implements
ENCODER_CAPABILITIES = ENCODER


class RowsBatch(RowsBatchBase[Rows, Row]):
    """The engine's `Batch`: `Rows`, with a request's constraint made as the serial path
    makes it."""

    def __init__(
        self, rows: Rows, grammars: Grammars, decode: Callable[[Sequence[int]], str]
    ) -> None:
        super().__init__(rows, Row)
        self._grammars = grammars
        self._decode = decode  # the engine's: a thinking budget reads the reply's text

    def join(self, joiner: Joiner, now: bool | None = None) -> Row:
        """A row's prefill and steps run its steering and feed its monitor; a capture is
        refused: a reading runs on the serial path (OAI-ACT-25, docs/DECISIONS.md). `now`:
        as `Rows.join`."""
        rng, hooks = joiner.rng, joiner.hooks
        if rng is not None and not isinstance(rng, torch.Generator):
            raise TypeError("rng must come from this engine's new_rng")
        if hooks.capture is not None:
            raise ValueError("a row captures no layer: readings run on the serial path")
        if joiner.params.prompt_logprobs is not None:
            raise ValueError("a row reports no prompt logprobs: echo runs on the serial path")
        guide = self._grammars.mask(joiner.params, self._decode)
        return self._rows.join(
            joiner.prompt_ids,
            joiner.params,
            rng=rng,
            guide=guide,
            steering=hooks.steering,
            monitor=hooks.monitor,
            now=now,
        )

    def join_all(self, joiners: Sequence[Joiner]) -> list[BatchRow | Exception]:
        """Each joins alone, in turn: a row prefills as a batch of one, under its own
        steering (batch.py), at once when no row was busy, else at the steps; a refusal or
        failure is that joiner's alone."""
        joined: list[BatchRow | Exception] = []
        now = not self._rows.busy
        for joiner in joiners:
            try:
                joined.append(self.join(joiner, now))
            except Exception as exc:  # this prompt's fault or the engine's: this row only
                joined.append(exc)
        return joined
