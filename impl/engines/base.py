"""The Engine protocol: what the serving layer asks of a model runtime.

Engines never import Connexion or Starlette. Everything they take and give
is a plain value from this module, so the serving layer is engine-agnostic.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from .monitor import Monitor
from .prompt_cache import PromptCache


class EngineId(StrEnum):
    """The engines, one name each in code (the package under `engines/`).

    A value is the engine's key in spec/policy/fields.yaml, `gguf` for
    llama.cpp, and the word error messages use; `ENGINE_NAMES` holds the name
    the API shows.
    """

    TRANSFORMERS = "transformers"
    LLAMACPP = "gguf"


ENGINE_NAMES: Mapping[EngineId, str] = {
    EngineId.TRANSFORMERS: "transformers",
    EngineId.LLAMACPP: "llama.cpp",
}
"""Each engine's name as the API shows it: the config's `engine` choices, /api/info's
`engine`, `ModelFacts.engine` and so the end of `system_fingerprint`."""


class Capability(StrEnum):
    """What an engine can do; a value is the name `{needs: ...}` gives it in
    spec/policy/fields.yaml."""

    GENERATE = "generate"
    CHAT = "chat"
    SEED = "seed"
    STEERING = "steering"
    SCORING = "scoring"
    SCORING_FLOAT32 = "scoring_float32"
    DECIDE = "decide"
    BATCHED_CHAT = "batched_chat"
    EMBEDDINGS = "embeddings"
    STRUCTURED_OUTPUT = "structured_output"
    TOOLS = "tools"
    SAE_ACTIVATIONS = "sae_activations"
    MONITORING = "monitoring"  # probes read the residual stream (engines/monitor.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadOptions:
    """How a session loads its model: the config's session parameters (docs/LOCAL.md).

    0 and "auto" keep the model's or the library's own choice.
    """

    threads: int = 0  # forward-pass threads (torch on transformers, llama.cpp on GGUF)
    ctx_size: int = 0  # context tokens: at most the model's own length
    batch_size: int = 0  # prompt tokens per forward pass (llama.cpp's n_batch)
    dtype: str = "auto"  # transformers' compute type: auto, float32, bfloat16, float16
    device: str = "auto"  # where transformers runs: auto, cpu, cuda, cuda:N (device.py)
    n_gpu_layers: int = 0  # layers llama.cpp offloads to a GPU (a GPU build's only)
    mmap: bool = True  # llama.cpp maps the file instead of reading it
    mlock: bool = False  # llama.cpp locks the model's pages in RAM
    parallel: int = 1  # rows decoded together (continuous batching); 1 is serial, 0 auto
    cache_ram: int = -1  # MiB of prompt states kept (engines/prompt_cache.py): 0 none, -1 auto
    prefill_chunk: int = -1  # prompt tokens a step while rows decode (engines/rows.py): 0 all


DEFAULT_LOAD = LoadOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFacts:
    """What a loaded model says about itself (for /v1/models and fingerprints)."""

    model_id: str
    engine: str  # the engine's display name (ENGINE_NAMES)
    context_length: int
    vocab_size: int
    dtype: str
    quantization: str
    revision: str
    owned_by: str
    has_chat_template: bool
    d_model: int = 0
    n_layers: int = 0
    threads: int = 0  # the threads its forward passes use (0: not recorded)
    device: str = "cpu"  # where its forward passes run: cpu, cuda:N
    eog_ids: tuple[int, ...] = ()  # the ids that end a generation (`ignore_eos` bans them)


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to pick each next token. `temperature == 0` means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    constraint: Constraint | None = None
    top_k: int = 0  # sample among the k most likely tokens only; 0 is off
    # (id, bias) pairs added to the logits before the pick and a grammar's mask; -100 bans
    # the token, +100 allows only the tokens biased so (engines/logprobs.py, LogitBias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # each token's log-probability and its k best; None: none
    # with the prompt's own (echo): each prompt token's after the first, and its k best
    prompt_logprobs: int | None = None
    thinking: ThinkingBudget | None = None  # the most tokens a reasoning span may hold


@dataclass(frozen=True, slots=True)
class ThinkingBudget:
    """The most tokens a reply's reasoning span may hold (engines/thinking.py): past them the
    span's close is forced, token by token (`close_ids`, as the tokenizer writes `close`), and
    the answer follows. `inside`: the prompt opened the span, so the reply starts in it;
    otherwise a reply that starts with `open` opens it."""

    tokens: int
    open: str
    close: str
    close_ids: tuple[int, ...]
    inside: bool


@dataclass(frozen=True, slots=True)
class Constraint:
    """Generated text must match a grammar, masked token by token.

    `kind` "json_schema": `text` is a JSON Schema (canonical JSON text; `{"type":
    "object"}` is `json_object`). `kind` "call" (a forced tool call's
    continuation): `text` is JSON `{"options": [[head, schema], ...], "tail": t}`,
    and the output is one option's head, then a JSON document valid under its
    schema, then the tail. Engines with `structured_output` enforce both.
    """

    text: str
    kind: str = "json_schema"


class ConstraintUnsupported(ValueError):
    """The grammar library cannot enforce this schema (a fault of the request)."""


@dataclass(frozen=True, slots=True)
class Logprobs:
    """One position's log-probabilities (engines/logprobs.py): the token's own, then the `k`
    best (id, log-probability), highest first. They are the log-softmax of the logits the
    pick reads: after steering, the penalties, the logit bias and a grammar's mask; before
    temperature, top_k and top_p. A prompt position's are the model's alone."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Token:
    """One sampled token. `eos` is true for an end-of-sequence token; `logprobs` is set when
    `SamplingParams.logprobs` asks for it."""

    token_id: int
    eos: bool
    logprobs: Logprobs | None = None


@dataclass(frozen=True, slots=True)
class Prefilled:
    """The first item `generate` yields: how many prompt tokens the KV cache already held,
    and with `SamplingParams.prompt_logprobs` the prompt's own log-probabilities (one per
    prompt token after the first; the prefill then reuses no kept prefix)."""

    cached_tokens: int
    prompt_logprobs: tuple[Logprobs, ...] = ()


@dataclass(frozen=True, slots=True)
class ScoreQuery:
    """Next-token scoring: how to normalise and how many alternatives to report.

    `temperature` 0 means no scaling. With `allowed`, log-probabilities are
    normalised over those ids only and the best token is one of them.
    `alternatives` is how many of the best candidates to report.
    """

    temperature: float = 0.0
    allowed: tuple[int, ...] | None = None
    alternatives: int = 0
    precision: str = "native"  # or "float32": a float32 copy of the model (OAI-F32)
    prompt_logprobs: int | None = None  # echo: the prompt's own too, with their k best
    reuse: bool = False  # a held or cached unsteered prefix may be reused (issue 43)


@dataclass(frozen=True, slots=True)
class Scored:
    """The next token's distribution: the best candidate and the reported alternatives.

    Each is (token id, log-probability); alternatives are sorted by
    log-probability, highest first.
    """

    best: tuple[int, float]
    alternatives: tuple[tuple[int, float], ...]
    prompt: tuple[Logprobs, ...] = ()  # with `ScoreQuery.prompt_logprobs`, as Prefilled's
    cached_tokens: int = 0  # prompt tokens the KV already held (kept, or a cached prefix)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One decision (LOC-DECIDE): the choices' first-token log-probabilities and what it cost.

    `logps[i]` is the log-probability of choice i's first token over the whole
    vocabulary (None for minus infinity); `n_reused` tokens came from the kept
    prefix state, `n_prefilled` ran now. Times are seconds; `prefill_cpu_s`
    is process CPU time. `prefix_state_mib` is the size of the state kept.
    """

    cancelled: bool
    logps: tuple[float | None, ...]
    n_tokens: int
    n_reused: int
    n_prefilled: int
    restore_s: float
    store_s: float
    prefill_s: float
    prefill_cpu_s: float
    prefix_state_mib: float


class EmbeddingsDisabled(RuntimeError):
    """The model was loaded unable to embed (GGUF_ENABLE_EMBEDDINGS=false)."""


class PrecisionUnavailable(RuntimeError):
    """Float32 scoring cannot be served; `reason` is one of OAI-F32's reason tokens."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NonFiniteLogits(ArithmeticError):
    """NaN or +inf logits where they reach the answer, or -inf on a reported token."""


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A chat to render: OpenAI-shaped messages plus template variables.

    `tools` (OpenAI tool objects) are handed to the template; `opening` is
    appended after the generation prompt (a forced tool call's opening,
    OAI-TOOLS-14).
    """

    messages: Sequence[Mapping[str, Any]]
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tools: Sequence[Mapping[str, Any]] = ()
    opening: str = ""


class PromptError(ValueError):
    """The client's prompt cannot be rendered (a fault of the request, not the server)."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


class Rng(Protocol):
    """An opaque per-request random source made by `Engine.new_rng`."""


class SteeringSource(Protocol):
    """What steering hooks read at every forward pass (see miserver.steering.source)."""

    def layers(self) -> frozenset[int]:
        """The layers to hook."""
        ...

    def vector(self, layer: int) -> Any:
        """The vector (a tensor) to add at `layer` in this pass; None adds nothing."""
        ...

    def key(self) -> Hashable:
        """The state now served (KV computed under another state is never reused)."""
        ...

    def mixed(self) -> bool:
        """Whether the hooks have served more than one state since the source was made."""
        ...


class BatchRow(Protocol):
    """One sequence of a batch: its newest token (picked, not yet fed), how many tokens it
    may generate, and how many prompt tokens its KV already held. A row that joined while
    others decoded may still be prefilling (chunked prefill): it is not `ready`, and its
    `last` holds no token until a step makes it ready."""

    @property
    def ready(self) -> bool: ...

    @property
    def last(self) -> Token: ...

    @property
    def budget(self) -> int: ...

    @property
    def cached(self) -> int: ...


@dataclass(eq=False, slots=True)
class Capture:
    """A layer to read while a generation runs (OAI-ACT): its output rows, one per position
    fed, before this layer's steering delta with `pre_steering`, else after it. The engine
    records them (`record`) as the generation ends; a capture is made for one generation."""

    layer: int
    pre_steering: bool
    rows: Any = None  # [positions, width], once recorded

    def record(self, rows: Any) -> None:
        self.rows = rows


@dataclass(frozen=True, slots=True)
class Hooks:
    """What runs in a generation's forward passes beside the model: a steering source, a
    probe monitor, a layer capture (and, later, a logit processor). The engine enters them
    itself, on the serial path (`Engine.generate`) as on a row (`Batch.join`); an engine
    that cannot run one refuses the generation (ValueError)."""

    steering: SteeringSource | None = None
    monitor: Monitor | None = None
    capture: Capture | None = None


NO_HOOKS = Hooks()


@dataclass(frozen=True, slots=True)
class Joiner:
    """One prompt joining a batch (`Batch.join`, `Batch.join_all`)."""

    prompt_ids: Sequence[int]
    params: SamplingParams
    rng: Rng | None
    hooks: Hooks = NO_HOOKS


class Batch(Protocol):
    """Rows decoded together, one token each per step (continuous batching).

    Blocking, and only ever called from the engine's worker thread.
    """

    @property
    def capacity(self) -> int:
        """The most rows at once."""
        ...

    @property
    def window(self) -> int:
        """The most tokens one row holds: its prompt and what it generates."""
        ...

    def join(self, joiner: Joiner) -> BatchRow:
        """Take a free row for a prompt, prefill it and pick its first token (or, while other
        rows decode, leave it not `ready` for the steps to prefill); the row's passes, its
        prefill and every step, run under its hooks (refused, ValueError, where the engine
        cannot run them; a row that reads every position reuses no kept prefix)."""
        ...

    def join_all(self, joiners: Sequence[Joiner]) -> list[BatchRow | Exception]:
        """`join` each, in order of the result: a joiner refused (or whose prefill failed)
        gets its exception, the others their row. An engine may prefill them together."""
        ...

    def step(
        self, rows: Sequence[BatchRow], *, decode: bool = True, cap: int | None = None
    ) -> None:
        """Feed each ready row's newest token in one forward pass and pick each one's next;
        prefill the rows not ready further (a row whose prompt ends gets its first token and
        is ready). `decode` False: the ready rows sit this step out, and the rows not ready
        are prefilled whole, as on an idle batch (an interactive request's prompt while only
        Batch API rows decode, serving/completions/batching.py). `cap`: at most this many
        prompt tokens while rows decode (Batch API prompts: short steps, which an interactive
        request arriving waits for)."""
        ...

    def leave(self, row: BatchRow) -> None:
        """Free the row (idempotent)."""
        ...


class Engine(Protocol):
    """A loaded model that can tokenize, render chats and generate: the core every engine
    implements. What only some engines do is an optional protocol of
    engines/capabilities.py (scoring, deciding, embedding, grammars, steering, reading),
    and `capabilities` is derived from the ones it implements (`capabilities_of`)."""

    @property
    def facts(self) -> ModelFacts: ...

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, keep_special: bool = False) -> str:
        """Text of `token_ids`; special tokens left out unless `keep_special`."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template text; None when it has none."""
        ...

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (scoring keys and `bytes`)."""
        ...

    def render_chat(self, prompt: ChatPrompt) -> list[int]:
        """Token ids of the chat, rendered with the generation prompt.

        A trailing assistant message is continued, not closed. The ids hold
        at most one BOS (OAI-TOKIDS).
        """
        ...

    def new_rng(self, seed: int | None) -> Rng | None:
        """A random source for one request; None means the engine's global one."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        rng: Rng | None,
        hooks: Hooks = NO_HOOKS,
    ) -> Generator[Prefilled | Token, None, None]:
        """One `Prefilled`, then up to `params.max_tokens` tokens; the last may be an EOS.

        Blocking: callers run it in a worker thread. Every forward pass runs under
        `hooks`, entered as the generation starts and left before it ends (a
        capture's rows are recorded by then). Closing the iterator stops generation
        before the next forward pass; the engine keeps or frees its KV cache.
        """
        ...

    @property
    def batch(self) -> Batch | None:
        """The rows this engine decodes together; None when it was loaded serial."""
        ...

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The prompt states it keeps across requests (prompt_cache.py); None when off."""
        ...

    def close(self) -> None: ...
