"""The planner's rules, one per knob, and what they decide (REQ-003 PLAN-12..22, CONC-13).

Each rule reads the facts (the model's shape, this machine, the config
without the plan layer) and gives a value, its `source`, a `brief` for a
person (one sentence, at most 120 characters, with the number that decided
it, no flag names) and the full `reason` that `explain` prints. A key the
person set (`user_keys`) is never decided: it comes back `operator`, its
value untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..engines.base import EngineId
from ..engines.rows import MAX_ROWS, ROW_WINDOW, rows_for
from . import cost
from .devices import Device
from .machine import Machine
from .shape import Shape

MIB = 1 << 20
BATCH = 512  # prompt tokens a pass: llama.cpp's own micro-batch
MIN_CTX = 512
GPU_ROWS = 32  # rows a GPU decodes together at most (the device check's widest batch)
GPU_SHARE = 0.9  # of a card's memory a plan fills: the rest is the CUDA context and buffers
GIB = 1 << 30
THREADS_TIE = 0.03  # a slower decode than the fastest by at most this still counts as tied


@dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    shape: Shape
    machine: Machine
    base: Mapping[str, Any]  # the config without the plan layer (LOC-APPLY-05)
    user_keys: frozenset[str]
    gpu: bool  # a usable device beyond the host
    card: Device | None = None  # the CUDA device torch would run on (the largest usable)


@dataclass(frozen=True, slots=True, kw_only=True)
class Decided:
    value: Any
    source: str  # measured | derived | policy | operator | unprobed
    brief: str
    reason: str


Rule = Callable[[Facts, Mapping[str, Any]], Decided]


def _threads(facts: Facts, _: Mapping[str, Any]) -> Decided:
    m, shape = facts.machine, facts.shape
    n = m.physical_cores
    if not m.kernels:
        return Decided(
            value=n,
            source="derived",
            brief=f"{n} physical cores this server may use: one thread on each.",
            reason=(
                f"The engine's kernels were not timed ({m.kernels_why}), so the thread count "
                f"is llama.cpp's own default: one thread on each of the {n} physical cores "
                "this process may use (CPU affinity and any cgroup CPU quota respected)."
            ),
        )
    dtype = _dtype_of(facts)
    prices = {}
    for timed in m.kernels:
        prices[timed.threads] = cost.decode_s(shape, m, _at(timed.threads, dtype)) or math.inf
    fastest = min(prices.values())
    chosen = max(t for t, price in prices.items() if price <= fastest * (1 + THREADS_TIE))
    others = [t for t in prices if t != chosen]
    if others:
        other = max(others, key=lambda t: (prices[t], t))
        brief = (
            f"{chosen} thread(s): {prices[chosen] * 1000:.1f} ms a token, against "
            f"{prices[other] * 1000:.1f} ms on {other}."
        )
    else:
        brief = f"{chosen} thread: {prices[chosen] * 1000:.1f} ms a token on the one core."
    priced = "; ".join(
        f"{t} thread(s): {price * 1000:.2f} ms a token, prompts at "
        f"{(cost.prefill_tokens_per_s(shape, m, _at(t, dtype)) or 0):.0f} tokens/s"
        for t, price in sorted(prices.items())
    )
    return Decided(
        value=chosen,
        source="measured",
        brief=brief,
        reason=(
            f"This process may run on {m.logical_cpus} CPUs, {n} of them physical cores "
            "(CPU affinity and any cgroup CPU quota respected). The engine's own kernels "
            "were timed on this model's matrices at each candidate count and the decode "
            f"priced from them: {priced}. The fastest decode is chosen; a count within "
            f"{THREADS_TIE:.0%} of it with more threads wins, since prompts run faster on "
            "more threads."
        ),
    )


def _at(threads: int, dtype: str) -> cost.Settings:
    return cost.Settings(
        threads=threads, ctx_size=MIN_CTX, batch_size=BATCH, parallel=1, dtype=dtype
    )


def _on_card(facts: Facts, decided: Mapping[str, Any]) -> Device | None:
    """The card the model runs on: transformers placed on a CUDA device (the `device` rule)."""
    if facts.shape.engine != EngineId.TRANSFORMERS or decided.get("device") in (None, "cpu"):
        return None
    return facts.card


def _card_dtype(facts: Facts) -> str:
    """The type transformers computes in on a card: the person's, else bfloat16."""
    chosen = _dtype_of(facts)
    return (
        "bfloat16" if chosen in ("auto", "float32") and "dtype" not in facts.user_keys else chosen
    )


def _card_room(facts: Facts, card: Device) -> int:
    """The bytes of the card's share left for KV once the weights are on it."""
    weights = facts.shape.weight_bytes(_card_dtype(facts))
    return max(0, int(card.memory_total * GPU_SHARE) - weights)


def _device(facts: Facts, _: Mapping[str, Any]) -> Decided:
    if facts.shape.engine == EngineId.LLAMACPP:
        return Decided(
            value="auto",
            source="policy",
            brief="llama.cpp places layers by GPU layers; the device is transformers'.",
            reason="The device applies to transformers only; llama.cpp offloads by layer count.",
        )
    card = facts.card
    if card is None:
        return Decided(
            value="cpu",
            source="measured",
            brief=f"The CPU: no GPU torch can use ({facts.machine.physical_cores} cores).",
            reason=(
                "The device probe found no CUDA device this build of torch can use, so the "
                "model, its KV cache and every reading stay in host memory."
            ),
        )
    value = "cuda" if card.name == "cuda:0" else card.name
    return Decided(
        value=value,
        source="measured",
        brief=(
            f"{card.name}, {card.description}: {card.memory_total // GIB} GiB, "
            f"{card.token_ratio:.0f}x the host's matmul rate."
        )[:120],
        reason=(
            f"The device probe found {card.name} ({card.description}, "
            f"{card.memory_total // GIB} GiB), timed at {card.token_ratio:.1f} times the host "
            "on a matmul; the model, its KV cache, the batch's rows, steering deltas, SAEs and "
            "probes go there, the largest usable card."
        ),
    )


def _ctx_size(facts: Facts, decided: Mapping[str, Any]) -> Decided:
    card = _on_card(facts, decided)
    if card is not None:
        return _card_ctx_size(facts, card)
    shape, m = facts.shape, facts.machine
    trained = shape.n_ctx_train or 4096
    dtype = _dtype_of(facts)
    room = cost.budget(m)

    def held(ctx: int) -> int:
        plan = cost.Settings(
            threads=1, ctx_size=ctx, batch_size=BATCH, parallel=rows_for(ctx), dtype=dtype
        )
        return sum(row.bytes for row in cost.ledger(shape, plan))

    ctx = trained
    while ctx > MIN_CTX and held(ctx) > room:
        ctx = max(MIN_CTX, (ctx - 1) // 256 * 256)
    total = held(ctx)
    per_token = shape.kv_bytes_per_token(dtype)
    kv = per_token * ctx
    if ctx == trained:
        brief = f"The model's own window, {ctx} tokens; its cache takes {kv // MIB} MiB."
        source = "derived"
    else:
        brief = f"{ctx} tokens of the model's {trained}: what {room // MIB} MiB of memory holds."
        source = "measured"
    return Decided(
        value=ctx,
        source=source,
        brief=brief,
        reason=(
            f"The model was trained on {trained} tokens; each token's keys and values take "
            f"{per_token} bytes over {shape.n_layer} layers. The window is the largest "
            f"multiple of 256 up to the trained length whose whole ledger (weights, caches, "
            f"compute buffers: {total // MIB} MiB) fits in the {room // MIB} MiB this "
            f"process may hold now: {ctx} tokens, {kv // MIB} MiB of cache a context."
        ),
    )


def _card_ctx_size(facts: Facts, card: Device) -> Decided:
    """The window one row's KV fits on the card beside the weights, at most the trained one."""
    shape, dtype = facts.shape, _card_dtype(facts)
    trained = shape.n_ctx_train or 4096
    per_token = shape.kv_bytes_per_token(dtype)
    room = _card_room(facts, card)
    fits = room // per_token // 256 * 256 if per_token else trained
    ctx = max(MIN_CTX, min(trained, fits))
    return Decided(
        value=ctx,
        source="derived" if ctx == trained else "measured",
        brief=(
            f"The model's own window, {ctx} tokens, on {card.name}."
            if ctx == trained
            else f"{ctx} tokens of the model's {trained}: what {room // MIB} MiB hold."
        ),
        reason=(
            f"On {card.name} the weights take {shape.weight_bytes(dtype) // MIB} MiB in "
            f"{dtype}; {GPU_SHARE:.0%} of its {card.memory_total // MIB} MiB leaves "
            f"{room // MIB} MiB for keys and values, {per_token} bytes a token: the "
            f"window is the trained {trained} tokens, or less where one row would not fit."
        ),
    )


def _card_parallel(facts: Facts, card: Device, ctx: int) -> Decided:
    """As many rows as the card's KV room holds at a full window each, at most GPU_ROWS."""
    per_row = facts.shape.kv_bytes_per_token(_card_dtype(facts)) * ctx
    room = _card_room(facts, card)
    rows = max(1, min(GPU_ROWS, room // per_row if per_row else GPU_ROWS))
    return Decided(
        value=rows,
        source="derived",
        brief=f"{rows} rows decode together on {card.name}: each row's {ctx} tokens fit."[:120],
        reason=(
            f"A GPU reads the weights once a step for every row, so rows cost little until "
            f"their keys and values fill it: {room // MIB} MiB hold {room // max(per_row, 1)} "
            f"rows of a full {ctx}-token window ({per_row // MIB} MiB each), at most "
            f"{GPU_ROWS}."
        ),
    )


def _batch_size(facts: Facts, _: Mapping[str, Any]) -> Decided:
    return Decided(
        value=BATCH,
        source="policy",
        brief=f"{BATCH} prompt tokens a pass: the matmuls are wide enough to run at full rate.",
        reason=(
            f"A prompt runs {BATCH} tokens a forward pass (llama.cpp's own micro-batch). "
            "Wider passes gain little on a CPU, whose matmul rate is reached well before, and "
            "grow the compute buffers with the attention scores of every token in the pass."
        ),
    )


def _parallel(facts: Facts, decided: Mapping[str, Any]) -> Decided:
    ctx = int(decided.get("ctx-size", facts.shape.n_ctx_train or 4096))
    card = _on_card(facts, decided)
    if card is not None:
        return _card_parallel(facts, card, ctx)
    rows = rows_for(ctx)
    if rows == 1:
        brief = f"Serial: a {ctx}-token window is too small to share among rows."
    else:
        brief = f"{rows} rows of {ctx // rows} tokens decode together when clients overlap."
    return Decided(
        value=rows,
        source="derived",
        brief=brief,
        reason=(
            "Continuous batching decodes several requests in one forward pass, which reads "
            "the weights once for all of them: clients that overlap get more tokens a second "
            f"together, and one alone runs as fast as serial. The rows share the window, so "
            f"each keeps at least {ROW_WINDOW} tokens: {rows} row(s) of {ctx // rows}, at most "
            f"{MAX_ROWS}."
        ),
    )


def _dtype(facts: Facts, decided: Mapping[str, Any]) -> Decided:
    if facts.shape.engine == EngineId.LLAMACPP:
        return Decided(
            value="auto",
            source="policy",
            brief="llama.cpp computes in the file's own quantized types.",
            reason=(
                "The weight type applies to transformers only; llama.cpp runs the GGUF "
                "file's own types."
            ),
        )
    card = _on_card(facts, decided)
    if card is not None:
        half = _card_dtype(facts)
        return Decided(
            value=half,
            source="policy",
            brief=f"{half} on {card.name}: half the bytes of float32, at the card's tensor rate.",
            reason=(
                f"A GPU computes {half} matmuls on its tensor cores at several times its float32 "
                "rate, and the weights and KV cache take half the memory; greedy text may "
                "differ from float32's in late tokens, as on every GPU server."
            ),
        )
    return Decided(
        value="float32",
        source="policy",
        brief="float32: a CPU computes it without converting each weight.",
        reason=(
            "On a CPU, half-precision matmuls are converted back to float32 unless the "
            "processor has bfloat16 instructions, so the weights are held in float32 (a GGUF's "
            "conversion is float32 already)."
        ),
    )


def _n_gpu_layers(facts: Facts, _: Mapping[str, Any]) -> Decided:
    if not facts.gpu:
        return Decided(
            value=0,
            source="measured",
            brief=f"No GPU this server could use: all {facts.shape.n_layer} layers run on the CPU.",
            reason=(
                "The device probe found no compute device beyond the host that this build "
                "can use; every layer stays in host memory."
            ),
        )
    layers = facts.shape.n_layer
    return Decided(
        value=layers,
        source="derived",
        brief=f"All {layers} layers on the GPU.",
        reason=f"A usable GPU was found; its layers, {layers}, are all offloaded.",
    )


def _mmap(facts: Facts, _: Mapping[str, Any]) -> Decided:
    weights = facts.shape.weight_bytes(_dtype_of(facts))
    room = cost.budget(facts.machine)
    fits = weights <= room
    return Decided(
        value=True,
        source="policy" if fits else "measured",
        brief=(
            f"Mapped: the {weights // MIB} MiB of weights load in a moment and share the page "
            "cache."
            if fits
            else f"Mapped: {weights // MIB} MiB of weights exceed the {room // MIB} MiB free."
        ),
        reason=(
            "Mapping the GGUF file makes a load take milliseconds and lets the page cache hold "
            "the weights once for every process that reads them; a model larger than memory "
            "still runs, paged from disk, where reading it whole would fail."
        ),
    )


def _mlock(facts: Facts, _: Mapping[str, Any]) -> Decided:
    m = facts.machine
    weights = facts.shape.weight_bytes(_dtype_of(facts))
    limit = m.lock_limit
    lockable = limit is None or limit >= weights
    ample = weights * 4 <= cost.budget(m)
    value = lockable and ample and m.lock_known and limit is None
    if value:
        brief = f"Locked: the {weights // MIB} MiB of weights stay in RAM; memory is ample."
    elif not lockable:
        cap = 0 if limit is None else limit
        brief = f"Not locked: this process may lock {cap // MIB} MiB, the weights take more."
    else:
        brief = "Not locked: the page cache keeps a model in use resident anyway."
    return Decided(
        value=value,
        source="measured" if m.lock_known else "unprobed",
        brief=brief,
        reason=(
            f"Locking keeps the weights from being paged out. The lock ceiling "
            f"(RLIMIT_MEMLOCK) is {'unlimited' if limit is None else f'{limit} bytes'}; a "
            "lock above it fails at load time. It is asked for only when the ceiling is "
            "unlimited and the weights take at most a quarter of the memory available."
        ),
    )


RULES: dict[str, Rule] = {  # in the order decided: later rules read earlier values
    "threads": _threads,
    "device": _device,
    "ctx-size": _ctx_size,
    "batch-size": _batch_size,
    "parallel": _parallel,
    "dtype": _dtype,
    "n-gpu-layers": _n_gpu_layers,
    "mmap": _mmap,
    "mlock": _mlock,
}


def rules_for(facts: Facts) -> dict[str, Decided]:
    """Every knob's decision; a key in `user_keys` keeps the person's value (`operator`)."""
    decided: dict[str, Any] = {}
    found: dict[str, Decided] = {}
    for knob, rule in RULES.items():
        if knob in facts.user_keys:
            value = facts.base[knob]
            found[knob] = Decided(
                value=value,
                source="operator",
                brief="Your own setting, kept as you set it.",
                reason=f"`{knob}` is one of your settings (user_keys): a plan never changes it.",
            )
        else:
            found[knob] = rule(facts, decided)
        decided[knob] = found[knob].value
    return found


def settings_of(values: Mapping[str, Any], shape: Shape, machine: Machine) -> cost.Settings:
    """The cost model's settings from parameter values ("auto" read as the engines do)."""

    def count(key: str, auto: int) -> int:
        value = values.get(key, "auto")
        return auto if value == "auto" else int(value)

    ctx = count("ctx-size", shape.n_ctx_train or 4096)
    return cost.Settings(
        threads=count("threads", machine.physical_cores),
        ctx_size=ctx,
        batch_size=count("batch-size", BATCH),
        parallel=count("parallel", rows_for(ctx)),
        dtype=str(values.get("dtype", "auto")),
    )


def _dtype_of(facts: Facts) -> str:
    value = facts.base.get("dtype", "auto")
    return str(value) if "dtype" in facts.user_keys else "auto"
