"""The cost model: what a model costs on this machine with given settings (REQ-003
PLAN-27..29).

Decoding one token multiplies every weight a token uses once: the bytes it
touches at the rate the engine's own kernel multiplied this model's matrices
by one token (planner/kernels.py), plus each layer's cost beyond its
products (the other operations' dispatch and barriers), plus a fixed step
(the engine building and starting the pass, sampling, detokenising). A
prompt runs at the kernel's prompt-wide rate. Thread counts between the
timed ones are read on the line between them. Without timings there is no
price. The memory ledger is what a load holds for its whole run: the
weights, the KV cache for `ctx-size` tokens of every row (`parallel`), and
the compute buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.base import EngineId
from .kernels import Kernels
from .machine import Machine
from .shape import Shape

STEP_S = 0.0015  # a step beyond its layers: the pass built and started, sampling, detokenising
BUFFER_TOKENS = 512  # compute buffers are sized for this many prompt tokens at most
MARGIN = 512 << 20  # memory kept free for the server, the OS and page cache


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The settings a price depends on."""

    threads: int
    ctx_size: int
    batch_size: int
    parallel: int
    dtype: str  # transformers' compute type, or "auto"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the ledger: a thing held for the whole run (LOC-PLAN-29)."""

    name: str
    label: str
    bytes: int
    locked: bool = False
    in_turn: bool = False


def decode_s(shape: Shape, machine: Machine, settings: Settings) -> float | None:
    """Predicted seconds per decoded token (one row); None without kernel timings."""
    timed = kernels_at(machine, settings.threads)
    if timed is None:
        return None
    products = shape.token_bytes(settings.dtype) / timed.token_rate
    return products + shape.n_layer * timed.layer_s + STEP_S


def prefill_tokens_per_s(shape: Shape, machine: Machine, settings: Settings) -> float | None:
    """Predicted prompt tokens a second; None without kernel timings."""
    timed = kernels_at(machine, settings.threads)
    if timed is None:
        return None
    return timed.prompt_flops / (2 * shape.params * shape.active_fraction)


def kernels_at(machine: Machine, threads: int) -> Kernels | None:
    """The kernels at `threads`: as timed, on the line between the two timed counts around
    it, or the nearest timed count outside them."""
    timed = machine.kernels
    if not timed:
        return None
    below = [k for k in timed if k.threads <= threads] or [timed[0]]
    above = [k for k in timed if k.threads >= threads] or [timed[-1]]
    low, high = below[-1], above[0]
    if low.threads == high.threads:
        return low
    share = (threads - low.threads) / (high.threads - low.threads)

    def between(a: float, b: float) -> float:
        return a + (b - a) * share

    return Kernels(
        threads=threads,
        token_rate=between(low.token_rate, high.token_rate),
        layer_s=between(low.layer_s, high.layer_s),
        prompt_flops=between(low.prompt_flops, high.prompt_flops),
    )


def ledger(shape: Shape, settings: Settings) -> list[Row]:
    """What the load holds: weights, KV cache, compute buffers (LOC-PLAN-28/29)."""
    per_token = shape.kv_bytes_per_token(settings.dtype)
    if shape.engine == EngineId.LLAMACPP:  # rows share the window in a context of their own
        contexts = 2 if settings.parallel > 1 else 1
        label = f"KV cache ({settings.ctx_size} tokens" + (
            ", and the rows')" if contexts > 1 else ")"
        )
    else:  # each row's cache grows to the window
        contexts = settings.parallel
        label = f"KV cache ({settings.ctx_size} tokens × {contexts} rows)"
    kv = per_token * settings.ctx_size * contexts
    return [
        Row("weights", "Model weights", shape.weight_bytes(settings.dtype)),
        Row("kv-cache", label, kv),
        Row("compute", "Compute buffers", compute_bytes(shape, settings), in_turn=True),
    ]


def compute_bytes(shape: Shape, settings: Settings) -> int:
    """The buffers of one forward pass over a prompt batch (at most BUFFER_TOKENS tokens),
    float32: attention scores against the whole window, a few widths of activations, and
    the logits of every row."""
    tokens = min(max(settings.batch_size, 1), BUFFER_TOKENS)
    scores = tokens * settings.ctx_size * shape.n_head
    activations = tokens * 8 * shape.n_embd
    logits = settings.parallel * shape.vocab
    return 4 * (scores + activations + logits)


def budget(machine: Machine) -> int:
    """What the process may hold: the memory available now, less the margin."""
    return max(0, machine.memory_available - MARGIN)
