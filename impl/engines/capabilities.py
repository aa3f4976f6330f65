"""What only some engines do: one protocol per capability, and `capabilities_of`.

The core `Engine` (engines/base.py) tokenizes, renders chats and generates.
An engine that also scores, decides, embeds, compiles grammars, steers or
reads its residual stream implements the protocol below that says so, and
nothing else: no engine writes a stub for what it cannot do. Each protocol
extends `Engine`, so an engine narrowed to one is still an engine. Its
`capabilities` are read off the protocols it implements, so the two never
disagree; the serving layer narrows an engine with `isinstance` before it
calls an optional member.

| Protocol      | Members                          | Capabilities                           |
|---------------|----------------------------------|----------------------------------------|
| (core)        | generate, render_chat, ...       | generate, chat, seed                   |
| `Scorer`      | score, scoring_precisions        | scoring, batched_chat; scoring_float32 |
|               |                                  | where "float32" is a precision         |
| `Decider`     | render_split, prefill_choices    | decide                                 |
| `Embedder`    | embedding_limit, embed           | embeddings                             |
| `Constrainer` | compile_constraint               | structured_output, tools               |
| `Steerable`   | steerable_layers                 | steering                               |
| `Inspectable` | readable_layers, user_span       | sae_activations, monitoring            |

`batched_chat` (several conversations in one request, `extra_messages`) goes
with scoring: the contract gives it to the engine whose judges score them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .base import (
    Capability,
    Capture,
    ChatPrompt,
    Constraint,
    Decision,
    Engine,
    Scored,
    ScoreQuery,
)

CORE = frozenset({Capability.GENERATE, Capability.CHAT, Capability.SEED})
ENCODER = frozenset({Capability.EMBEDDINGS})  # an encoder (BERT-style) only embeds


@runtime_checkable
class Scorer(Engine, Protocol):
    """Next-token scoring: one unsteered forward pass, no kept cache (OAI-SCORE)."""

    # The `ScoreQuery.precision` values served (a class attribute): "native", and
    # "float32" where a float32 copy of the model can be made (OAI-F32).
    scoring_precisions: frozenset[str]

    def score(
        self, prompt_ids: Sequence[int], query: ScoreQuery, capture: Capture | None = None
    ) -> Scored:
        """One unsteered forward pass over the prompt; the next token's log-probabilities
        (`capture`: a layer read in that pass, recorded before it returns).

        Blocking. Raises NonFiniteLogits (OAI-SCORE-22).
        """
        ...


@runtime_checkable
class Decider(Engine, Protocol):
    """One prefill, no decode: the first-token log-probabilities of a few choices (LOC-DECIDE)."""

    def render_split(self, prefix: str, suffix: str) -> tuple[list[int], int]:
        """Ids of `prefix + suffix` as one user message (reasoning off), and how many
        leading ids the prefix alone determines."""
        ...

    def prefill_choices(
        self,
        prompt_ids: Sequence[int],
        prefix_length: int,
        choice_ids: Sequence[int],
        *,
        reuse: bool,
        cancel: Any,
    ) -> Decision:
        """One prefill, no decode: the choices' first tokens' log-probabilities.

        Blocking. With `reuse`, the state after the first `prefix_length` ids
        is kept and restored for a later prompt that starts with them.
        `cancel` (a threading.Event) stops it between prefill chunks.
        """
        ...


@runtime_checkable
class Embedder(Engine, Protocol):
    """Vectors of whole inputs (OAI-EMB)."""

    @property
    def embedding_limit(self) -> int:
        """Most tokens one embedding input may hold; 0 when the model states none."""
        ...

    def embed(self, inputs: Sequence[Sequence[int]], pooling: str) -> Any:
        """Blocking: one vector per input (a float32 array [n, width]) from the last hidden
        layer, pooled `mean` / `last` / `cls` over every token (special ones included); no
        steering hook is ever active while embedding."""
        ...


@runtime_checkable
class Constrainer(Engine, Protocol):
    """Generation under a grammar (`SamplingParams.constraint`): structured output, tools."""

    def compile_constraint(self, constraint: Constraint) -> None:
        """Compile (and cache) the grammar of `constraint` before any generation uses it.

        Raises ConstraintUnsupported.
        """
        ...


@runtime_checkable
class Steerable(Engine, Protocol):
    """Steering deltas added at forward passes: a generation's `Hooks.steering` is run, on
    the serial path and on a row of the batch."""

    @property
    def steerable_layers(self) -> range:
        """The layers a steering source may add at (an SAE attaches there only)."""
        ...


@runtime_checkable
class Inspectable(Engine, Protocol):
    """The residual stream read while a generation runs: a generation's `Hooks.capture` and
    `Hooks.monitor` are run (a capture on the serial path and by `score`, a monitor on a row
    of the batch too), and a probe's `last_user` window is found."""

    @property
    def readable_layers(self) -> range:
        """The layers a capture or a probe may read."""
        ...

    def user_span(self, prompt: ChatPrompt) -> tuple[int, int] | None:
        """The token positions [start, end) of the last user message's content in
        `render_chat(prompt)` (a probe's `last_user` window); None when it has no text."""
        ...


PROVIDES: Mapping[type, frozenset[Capability]] = {
    Scorer: frozenset({Capability.SCORING, Capability.BATCHED_CHAT}),
    Decider: frozenset({Capability.DECIDE}),
    Embedder: frozenset({Capability.EMBEDDINGS}),
    Constrainer: frozenset({Capability.STRUCTURED_OUTPUT, Capability.TOOLS}),
    Steerable: frozenset({Capability.STEERING}),
    Inspectable: frozenset({Capability.SAE_ACTIVATIONS, Capability.MONITORING}),
}


def implements(engine: object, protocol: type) -> bool:
    """Whether `engine` (an engine or its class) has every member of `protocol`."""
    names = [*vars(protocol), *getattr(protocol, "__annotations__", {})]
    return all(hasattr(engine, name) for name in names if not name.startswith("_"))


def capabilities_of(engine: object) -> frozenset[Capability]:
    """What an engine (or an engine class, before any load) can do, read off the protocols
    it implements."""
    found = set(CORE)
    for protocol, gives in PROVIDES.items():
        if implements(engine, protocol):
            found |= gives
    precisions: frozenset[str] = getattr(engine, "scoring_precisions", frozenset())
    if Capability.SCORING in found and "float32" in precisions:
        found.add(Capability.SCORING_FLOAT32)
    return frozenset(found)
