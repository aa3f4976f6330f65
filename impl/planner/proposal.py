"""The proposal `GET /api/plan` answers (REQ-003 PLAN-09..45, -53, -55).

`propose` turns the decisions (planner/rules.py), the cost model's price
and ledger (planner/cost.py) and the devices into the documented shape: the
machine in a sentence, the regime, the decisions grouped `set` / `kept` /
`notes` with their words, the values and launch arguments that reproduce
them, the predicted decode cost, the memory pools, every device with its
ratios, and `explain`, the full account as text. Every word a UI shows is
made here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engines.base import ENGINE_NAMES, EngineId
from ..local.config import launch_args
from ..local.params import AUTO, Param, by_key
from . import cost
from .devices import NONE_TEXT, Device, Devices
from .machine import Machine, cpu_name
from .rules import Decided, Facts, rules_for, settings_of

MIB = 1 << 20
GIB = 1 << 30
NOTES = {  # note topics and their titles (LOC-PLAN-20)
    "regime": "Run mode",
    "placement": "Placement",
    "memory-ledger": "Memory use",
    "storage-rate": "Storage speed",
}
REGIMES = {
    "in-memory": "in memory",
    "mmap-paged": "paged from disk (larger than memory)",
    "gpu-offload": "partly on the GPU",
    "gpu-full": "on the GPU",
}
LOADED = (  # the proposal's warning when a model was resident while measuring (LOC-PLAN-53)
    "Planned with {loaded} loaded: the memory it holds reads as taken, so the plan "
    "is sized for a smaller machine. Unload it and plan again for the full figure."
)
# A knob that means nothing on an engine is left as it is (`kept`).
APPLIES = {
    "dtype": {EngineId.TRANSFORMERS},
    "mmap": {EngineId.LLAMACPP},
    "mlock": {EngineId.LLAMACPP},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """What is planned: the model's id and engine."""

    model_id: str
    engine: EngineId


def title(topic: str) -> str:
    """A note's title; a topic the server does not know is titled from its key."""
    return NOTES.get(topic, topic.replace("-", " ").capitalize())


def value_text(param: Param, value: Any) -> str:
    """`value` as a person reads it, through the parameter table (LOC-PLAN-18)."""
    for special in param.wire.get("special", ()):
        if special["value"] == value and not isinstance(value, bool):
            return str(special["label"])
    for choice in param.wire.get("choices", ()):
        if choice["value"] == value:
            return str(choice["label"])
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == AUTO:
        return "automatic"
    unit = param.wire.get("unit")
    return f"{value} {unit}" if unit else str(value)


def propose(
    subject: Subject,
    facts: Facts,
    devices: Devices,
    *,
    loaded: str = "",
) -> dict[str, Any]:
    """The proposal for `subject` on this machine; `loaded` names a model resident while
    the machine was measured (its memory read as taken: LOC-PLAN-53)."""
    decisions, values = _grouped(subject, facts)
    full = {**facts.base, **values}
    settings = settings_of(full, facts.shape, facts.machine)
    ledger = cost.ledger(facts.shape, settings)
    held = sum(r.bytes for r in ledger)
    budget = cost.budget(facts.machine)
    card = _card(subject, facts, full, devices)
    regime = _regime(held, budget, subject.engine, card is not None)
    per_token = cost.decode_s(facts.shape, facts.machine, settings)
    prefill = cost.prefill_tokens_per_s(facts.shape, facts.machine, settings)
    offloaded = int(values.get("n-gpu-layers") or 0)
    if card is not None and subject.engine == EngineId.TRANSFORMERS:
        offloaded = facts.shape.n_layer  # the whole model is on the card
    decisions += _notes(facts, regime, held, budget, ledger, offloaded)
    machine_text = machine_sentence(facts.machine)
    proposal: dict[str, Any] = {
        "available": True,
        "model": subject.model_id,
        "engine": ENGINE_NAMES[subject.engine],
        "machine": machine_text,
        "regime": regime,
        "streaming_declined": False,
        "decline_reason": "",
        "decisions": decisions,
        "values": values,
        "args": launch_args_of(values),
        "not_applicable": [],
        "summary": {
            "sentence": _summary(subject, settings, regime, per_token),
            "lanes": _lanes(card),
        },
        "predicted": _predicted(per_token, prefill),
        "memory": {"pools": _pools(facts.machine, ledger, full, card)},
        "devices": [_host_device(facts.machine), *_others(devices)],
        "devices_none": devices.none,
        "devices_none_text": NONE_TEXT[devices.none],
    }
    if loaded:
        proposal["warning"] = LOADED.format(loaded=loaded)
    proposal["explain"] = explain(proposal)
    return proposal


def _grouped(subject: Subject, facts: Facts) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each knob's decision, `set` or `kept` (LOC-PLAN-21), and the values the `set` ones give."""
    rows = by_key()
    decisions = []
    values: dict[str, Any] = {}
    for knob, found in rules_for(facts).items():
        applies = subject.engine in APPLIES.get(knob, {subject.engine})
        group = "set" if applies and found.source not in ("operator", "unprobed") else "kept"
        value = found.value if group == "set" else facts.base[knob]
        if group == "set":
            values[knob] = rows[knob].parse(value)
        decisions.append(
            _decision(knob, rows[knob].wire["label"], group, value, value_text(rows[knob], value))
            | _words(found if applies else _kept(knob))
        )
    return decisions, values


def launch_args_of(values: Mapping[str, Any]) -> list[str]:
    """`miserver serve` arguments that reproduce the plan's values alone, one per element
    (LOC-PLAN-43)."""
    return launch_args({key: "" for key in by_key()} | dict(values))


def machine_sentence(m: Machine) -> str:
    """The machine in one sentence (LOC-PLAN-10)."""
    return (
        f"{m.physical_cores} cores, {m.memory_available // MIB} MiB available of "
        f"{m.memory_total // MIB} MiB, {_rates(m)}"
    )


def _rates(m: Machine) -> str:
    """The kernels' best rates: a token's products and a prompt's."""
    if not m.kernels:
        return "the engine's kernels not timed"
    token = max(k.token_rate for k in m.kernels)
    prompt = max(k.prompt_flops for k in m.kernels)
    return f"{token / GIB:.1f} GiB/s on this model's matmul, {prompt / 1e9:.0f} GFLOP/s on a prompt"


def _kept(knob: str) -> Decided:
    return Decided(
        value=None,
        source="policy",
        brief="Left as it is: it means nothing on this engine.",
        reason=f"`{knob}` does not apply to the engine that serves this model, so it is kept.",
    )


def _decision(knob: str, label: str, group: str, value: Any, text: str) -> dict[str, Any]:
    return {"knob": knob, "label": label, "group": group, "value": value, "value_text": text}


def _words(found: Decided) -> dict[str, Any]:
    return {"source": found.source, "brief": found.brief or found.reason, "reason": found.reason}


def _regime(held: int, budget: int, engine: EngineId, gpu: bool) -> str:
    if gpu:
        return "gpu-full"
    if held <= budget or engine != EngineId.LLAMACPP:
        return "in-memory"
    return "mmap-paged"


def _placement(n_layer: int, offloaded: int) -> tuple[str, int, str, str]:
    """The placement note: where the layers run, named by the number that decides it (the
    layers on the host, `offloaded` of `n_layer` on the GPU)."""
    on_gpu = min(max(offloaded, 0), n_layer)
    on_host = n_layer - on_gpu
    text = f"{on_host} of {n_layer} layers on the CPU" + (
        f", {on_gpu} on the GPU" if on_gpu else ""
    )
    why = (
        "the GPU computes the offloaded layers, the host the rest"
        if on_gpu
        else "the host computes the prompt and the tokens"
    )
    return ("placement", on_host, text, f"{text[0].upper()}{text[1:]}: {why}.")


def _notes(
    facts: Facts,
    regime: str,
    held: int,
    budget: int,
    ledger: list[cost.Row],
    offloaded: int = 0,
) -> list[dict[str, Any]]:
    m = facts.machine
    read = m.read_rate
    notes = [
        (
            "regime",
            regime,
            REGIMES[regime],
            f"The model runs {REGIMES[regime]}: its ledger, {held // MIB} MiB, against "
            f"{budget // MIB} MiB this process may hold.",
        ),
        _placement(facts.shape.n_layer, offloaded),
        (
            "memory-ledger",
            held,
            f"{held // MIB} MiB",
            "Held for the whole run: "
            + "; ".join(f"{r.label} {r.bytes // MIB} MiB" for r in ledger)
            + ".",
        ),
        (
            "storage-rate",
            round(read),
            f"{read / MIB:.0f} MiB/s" if read else "not read",
            f"A sequential read of the model file ran at {read / MIB:.0f} MiB/s (from the "
            "page cache when the file was read lately): what a load, or a page fault of a "
            "mapped model, is bounded by."
            if read
            else "The model file was not read.",
        ),
    ]
    return [
        _decision(topic, title(topic), "notes", value, text)
        | {"source": "measured" if topic == "storage-rate" else "derived"}
        | {"brief": reason if len(reason) <= 120 else reason.split(":")[0] + ".", "reason": reason}
        for topic, value, text, reason in notes
    ]


def _predicted(per_token: float | None, prefill: float | None) -> dict[str, float]:
    """The price, absent without kernel timings (LOC-PLAN-27)."""
    found = {}
    if per_token is not None:
        found["s_per_token"] = round(per_token, 6)
    if prefill is not None:
        found["prefill_tokens_per_s"] = round(prefill, 1)
    return found


def _summary(
    subject: Subject, settings: cost.Settings, regime: str, per_token: float | None
) -> str:
    speed = (
        f"about {per_token * 1000:.1f} ms a token ({1 / per_token:.0f} tokens/s)"
        if per_token
        else "its speed not predicted (the engine's kernels were not timed)"
    )
    return (
        f"Runs {subject.model_id} {REGIMES[regime]} on {settings.threads} CPU thread(s) with "
        f"a {settings.ctx_size}-token window; {speed}."
    )


def _card(
    subject: Subject, facts: Facts, values: Mapping[str, Any], devices: Devices
) -> Device | None:
    """The device beyond the host the plan puts the model on: llama.cpp's offloaded layers'
    (the first usable device), or transformers' whole model (its `device`, a CUDA card)."""
    if subject.engine == EngineId.LLAMACPP:
        return devices.usable[0] if values.get("n-gpu-layers") and devices.usable else None
    return facts.card if values.get("device", "cpu") != "cpu" else None


def _lanes(card: Device | None) -> list[dict[str, Any]]:
    tokens = ["CPU"] + ([card.description] if card is not None else [])
    return [
        {"phase": "prompt", "label": "Prompt", "on": list(tokens)},
        {"phase": "tokens", "label": "Tokens", "on": tokens},
    ]


def _pools(
    m: Machine, ledger: list[cost.Row], values: Mapping[str, Any], device: Device | None
) -> list[dict[str, Any]]:
    """The host's pool, then one for the device that holds the layers (LOC-PLAN-28, -30):
    the weights and the KV cache move to it, the compute buffers stay on the host. One
    device takes every layer, so its figures are its own (no `estimated`, LOC-PLAN-34)."""
    mlock = bool(values.get("mlock"))
    if device is None:
        return [_host_pool(m, ledger, mlock)]
    placed = [r for r in ledger if r.name in ("weights", "kv-cache")]
    held = sum(r.bytes for r in placed)
    pool = {
        "name": device.name,
        "label": f"{device.description}'s memory",
        "cap_bytes": device.memory_total,
        "lockable_cap_bytes": 0,
        "lockable_cap_known": True,
        "held_bytes": held,
        "locked_bytes": 0,
        "cache_lock_unverified": False,
        "rows": [_row(r) for r in placed],
    }
    return [_host_pool(m, [r for r in ledger if r not in placed], mlock), pool]


def _row(r: cost.Row) -> dict[str, Any]:
    return {
        "name": r.name,
        "label": r.label,
        "bytes": r.bytes,
        "locked": r.locked,
        "in_turn": r.in_turn,
    }


def _host_pool(m: Machine, ledger: list[cost.Row], mlock: bool) -> dict[str, Any]:
    cap = cost.budget(m)
    lockable = cap if m.lock_limit is None else min(cap, m.lock_limit)
    return {
        "name": "host",
        "label": "This computer's memory",
        "cap_bytes": cap,
        "lockable_cap_bytes": lockable,
        "lockable_cap_known": m.lock_known,
        "held_bytes": sum(r.bytes for r in ledger),
        "locked_bytes": 0,
        "cache_lock_unverified": mlock,
        "rows": [_row(r) for r in ledger],  # a lock asked (mlock) is unverified: no row locked
    }


def _host_device(m: Machine) -> dict[str, Any]:
    return {
        "name": "CPU",
        "description": cpu_name(),
        "cpu": True,
        "own_memory": False,
        "memory_total": m.memory_total,
        "prompt_ratio": 1.0,
        "token_ratio": 1.0,
        "rate_text": _rates(m),
        "uses": ["prompt", "tokens", "layers"],
        "status": "used",
        "badge": "Used",
        "why": f"The host: {m.physical_cores} cores compute every layer.",
    }


def _others(devices: Devices) -> list[dict[str, Any]]:
    badges = {"used": "Used", "unused": "Not used", "refused": "Refused", "unusable": "Unusable"}
    return [
        {
            "name": d.name,
            "description": d.description,
            "cpu": False,
            "own_memory": True,
            "memory_total": d.memory_total,
            "prompt_ratio": d.prompt_ratio,
            "token_ratio": d.token_ratio,
            "rate_text": f"{d.prompt_ratio:.1f}× the host" if d.prompt_ratio else "not measured",
            "uses": [],
            "status": d.status,
            "badge": badges[d.status],
            "why": d.why or "This build runs on the CPU; the device is not used.",
        }
        for d in devices.found
    ]


def explain(proposal: Mapping[str, Any]) -> str:
    """The planner's full account, as text (LOC-PLAN-55)."""
    lines = [
        f"Plan for {proposal['model']} ({proposal['engine']})",
        f"Machine: {proposal['machine']}.",
        f"Summary: {proposal['summary']['sentence']}",
    ]
    if "warning" in proposal:
        lines.append(f"Warning: {proposal['warning']}")
    lines.append("")
    for d in proposal["decisions"]:
        lines.append(f"{d['label']}: {d['value_text']} [{d['group']}, {d['source']}]")
        lines.append(f"    {d['reason']}")
    lines.append("")
    lines.append(f"Devices: {proposal['devices_none_text'] or 'see the list'}")
    if proposal["args"]:
        lines.append("Arguments: " + " ".join(proposal["args"]))
    return "\n".join(lines) + "\n"
