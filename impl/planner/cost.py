"""The cost model: what a model costs on this machine with given settings (REQ-003
PLAN-27..29).

Decoding one token reads every weight a token uses once and multiplies by
each: it takes the longer of the bytes read at the measured memory rate and
two FLOPs a parameter at the measured one-token matmul rate, plus a fixed
step cost (sampling, detokenising, the engine's own bookkeeping). A prompt
runs at the prompt-wide matmul rate. The memory ledger is what a load holds
for its whole run: the weights, the KV cache for `ctx-size` tokens of every
row (`parallel`), and the compute buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engines.base import EngineId
from .machine import Machine
from .shape import Shape

STEP_S = 0.0015  # a decode step's own cost beyond the matmuls (sampling, bookkeeping)
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


def decode_s(shape: Shape, machine: Machine, settings: Settings) -> float:
    """Predicted seconds per decoded token (one row)."""
    scale = _thread_share(machine, settings.threads)
    read = shape.token_bytes(settings.dtype) / (machine.copy_rate * scale)
    active = shape.params * shape.active_fraction
    compute = 2 * active / (machine.token_flops * scale)
    return max(read, compute) + STEP_S


def prefill_tokens_per_s(shape: Shape, machine: Machine, settings: Settings) -> float:
    """Predicted prompt tokens a second."""
    active = shape.params * shape.active_fraction
    return machine.prompt_flops * _thread_share(machine, settings.threads) / (2 * active)


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


def _thread_share(machine: Machine, threads: int) -> float:
    """The rates were measured on every physical core; fewer threads get their share."""
    cores = max(1, machine.physical_cores)
    return min(max(threads, 1), cores) / cores
