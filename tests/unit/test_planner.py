"""The planner's rules on machines this one is not (REQ-003 PLAN, CONC-13; issue 21).

The model is the embedded SmolLM2 GGUF (its real header); the machine is a
`Machine` of the test's own figures: 8 cores with 2 GB free, or one where
the model does not fit, so each rule is seen deciding from a fact."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from miserver.engines.base import EngineId
from miserver.local.params import by_key, table
from miserver.planner import cost, devices
from miserver.planner.decisions import Facts
from miserver.planner.machine import Machine
from miserver.planner.proposal import Subject, propose, title, value_text
from miserver.planner.shape import Shape, read

GB = 10**9
MIB = 1 << 20
EIGHT_CORES = Machine(
    physical_cores=8,
    logical_cpus=16,
    memory_total=16 * GB,
    memory_available=2 * GB,
    disk_free=100 * GB,
    lock_limit=8 * MIB,
    lock_known=True,
    read_rate=2e9,
    copy_rate=20e9,
    prompt_flops=400e9,
    token_flops=40e9,
    seconds=1.5,
)
NO_DEVICE = devices.Devices((), "build")


@pytest.fixture(scope="module")
def smol(gguf_path: Path) -> Shape:
    return read(gguf_path, EngineId.LLAMACPP)


def base(**changes: Any) -> dict[str, Any]:
    return {row.key: row.default for row in table()} | {"model": "smol"} | changes


def facts(shape: Shape, machine: Machine = EIGHT_CORES, **kw: Any) -> Facts:
    return Facts(
        shape=shape,
        machine=machine,
        base=kw.pop("values", base()),
        user_keys=frozenset(kw.pop("user_keys", ())),
        gpu=kw.pop("gpu", False),
    )


def plan(shape: Shape, found: Facts, **kw: Any) -> dict[str, Any]:
    return propose(Subject(model_id="smol", engine=shape.engine), found, NO_DEVICE, **kw)


def test_the_header_gives_the_shape(gguf_path: Path, smol: Shape) -> None:
    """LOC-PLAN-04, LOC-HFI-03 (the planner's model probe shares the inspect code): the GGUF
    header alone gives layers, width, heads and window; the weights are held as stored on
    llama.cpp (f16 cache) and as float32 on transformers."""
    assert (smol.arch, smol.n_layer, smol.n_embd, smol.n_head, smol.n_kv_head) == (
        "llama",
        30,
        576,
        9,
        3,
    )
    assert (smol.n_ctx_train, smol.head_dim, smol.vocab) == (8192, 64, 49152)
    assert smol.weight_bytes("auto") == gguf_path.stat().st_size
    assert smol.kv_bytes_per_token("auto") == 2 * 30 * 3 * 64 * 2
    torch_side = read(gguf_path, EngineId.TRANSFORMERS)
    assert torch_side.weight_bytes("auto") == smol.params * 4
    assert torch_side.weight_bytes("bfloat16") == smol.params * 2


def test_decisions_come_from_the_facts_of_an_eight_core_machine(smol: Shape) -> None:
    """LOC-PLAN-03, LOC-PLAN-12, LOC-PLAN-13, LOC-PLAN-15, LOC-PLAN-17, LOC-PLAN-19,
    LOC-PLAN-21: 8 physical cores give 8 threads (`measured`); each decision has its
    label from the parameter table, a group, a source, a brief of one sentence of at most
    120 characters with its number and no flag, and the full reason."""
    proposal = plan(smol, facts(smol))
    decisions = {d["knob"]: d for d in proposal["decisions"]}
    assert decisions["threads"]["value"] == 8 and decisions["threads"]["source"] == "measured"
    assert "8" in decisions["threads"]["brief"]
    rows = by_key()
    for d in proposal["decisions"]:
        assert set(d) == {
            "knob",
            "label",
            "group",
            "value",
            "value_text",
            "source",
            "brief",
            "reason",
        }
        assert d["source"] in ("measured", "derived", "policy", "operator", "unprobed")
        assert d["group"] in ("set", "kept", "notes")
        assert len(d["brief"]) <= 120 and "--" not in d["brief"], d
        assert ". " not in d["brief"].rstrip(".") and len(d["reason"]) >= len(d["brief"]), d
        assert d["label"] == (
            rows[d["knob"]].wire["label"] if d["group"] != "notes" else title(d["knob"])
        )
        if d["group"] == "set":
            assert re.search(r"\d", d["brief"]) or d["source"] == "policy", d


def test_a_person_s_keys_are_never_planned(smol: Shape) -> None:
    """LOC-PLAN-14, LOC-CONC-13, LOC-APPLY-07: a key in `user_keys` comes back `operator`,
    `kept`, with the person's value, and is not in `values` or `args`."""
    found = facts(smol, values=base(threads=3), user_keys={"threads"})
    proposal = plan(smol, found)
    threads = next(d for d in proposal["decisions"] if d["knob"] == "threads")
    assert (threads["source"], threads["group"], threads["value"]) == ("operator", "kept", 3)
    assert "threads" not in proposal["values"] and "--threads" not in proposal["args"]


def test_values_args_and_words_go_through_the_parameter_table(smol: Shape) -> None:
    """LOC-PLAN-18, LOC-PLAN-42, LOC-PLAN-43, LOC-PLAN-45: `value` raw and `value_text` as a
    person reads it (a special value's label, a unit, on/off); `values` parse through the
    table; `args` reproduce them, one flag or value per element."""
    proposal = plan(smol, facts(smol))
    rows = by_key()
    for key, value in proposal["values"].items():
        assert rows[key].parse(value) == value
    assert value_text(rows["n-gpu-layers"], 0) == "none (CPU only)"
    assert value_text(rows["ctx-size"], 8192) == "8192 tokens"
    assert value_text(rows["mmap"], True) == "on"
    assert value_text(rows["parallel"], 1) == "serial"
    args = proposal["args"]
    assert all(" " not in a for a in args)
    assert args[args.index("--threads") + 1] == "8"
    assert proposal["not_applicable"] == []


def test_a_machine_that_cannot_hold_the_window_gets_a_smaller_one(smol: Shape) -> None:
    """LOC-PLAN-03, LOC-PLAN-28, LOC-PLAN-29: with little memory free, the window shrinks to
    what the ledger fits (`measured`), and the host pool's rows are the weights, the KV
    cache and the compute buffers."""
    tight = replace(EIGHT_CORES, memory_available=cost.MARGIN + smol.stored_bytes + 80 * MIB)
    proposal = plan(smol, facts(smol, tight))
    ctx = next(d for d in proposal["decisions"] if d["knob"] == "ctx-size")
    assert ctx["source"] == "measured" and 512 <= ctx["value"] < 8192
    [pool] = proposal["memory"]["pools"]
    assert pool["name"] == "host" and pool["held_bytes"] <= pool["cap_bytes"]
    assert [r["name"] for r in pool["rows"]] == ["weights", "kv-cache", "compute"]
    assert all(set(r) == {"name", "label", "bytes", "locked", "in_turn"} for r in pool["rows"])
    assert pool["held_bytes"] == sum(r["bytes"] for r in pool["rows"])


def test_a_model_larger_than_memory_is_paged(smol: Shape) -> None:
    """LOC-PLAN-11, LOC-PLAN-22: the regime says how the model runs (`mmap-paged` when even
    the smallest window's ledger exceeds the memory), never declines streaming; the notes are
    the regime, the placement, the ledger and the storage rate, each under its title."""
    starved = replace(EIGHT_CORES, memory_available=cost.MARGIN + 10 * MIB)
    proposal = plan(smol, facts(smol, starved))
    assert proposal["regime"] == "mmap-paged"
    assert (proposal["streaming_declined"], proposal["decline_reason"]) == (False, "")
    notes = [d for d in proposal["decisions"] if d["group"] == "notes"]
    assert [(d["knob"], d["label"]) for d in notes] == [
        ("regime", "Run mode"),
        ("placement", "Placement"),
        ("memory-ledger", "Memory use"),
        ("storage-rate", "Storage speed"),
    ]
    assert title("cache-floor") == "Cache floor"


def test_the_proposal_holds_every_documented_field(smol: Shape) -> None:
    """LOC-PLAN-09, LOC-PLAN-10, LOC-PLAN-25, LOC-PLAN-26, LOC-PLAN-27, LOC-PLAN-31,
    LOC-PLAN-35, LOC-PLAN-36, LOC-PLAN-37, LOC-PLAN-38, LOC-PLAN-39, LOC-PLAN-40,
    LOC-PLAN-53, LOC-PLAN-55: the machine in a sentence, the summary and its lanes, the
    predicted seconds a token, the host pool's lock ceiling, the host device at ratio 1.0,
    `devices_none` and its words, the warning when planned with a model loaded, and
    `explain` naming every decision."""
    proposal = plan(smol, facts(smol), loaded="other:Q4_0")
    for key in (
        "available",
        "model",
        "machine",
        "regime",
        "streaming_declined",
        "decline_reason",
        "decisions",
        "values",
        "args",
        "not_applicable",
        "summary",
        "predicted",
        "memory",
        "devices",
        "devices_none",
        "devices_none_text",
        "explain",
    ):
        assert key in proposal, key
    assert proposal["machine"].startswith("8 cores, 1907 MiB available of 15258 MiB")
    assert "8 CPU thread(s)" in proposal["summary"]["sentence"]
    assert [lane["phase"] for lane in proposal["summary"]["lanes"]] == ["prompt", "tokens"]
    assert all(lane["on"] == ["CPU"] for lane in proposal["summary"]["lanes"])
    assert 0 < proposal["predicted"]["s_per_token"] < 1
    pool = proposal["memory"]["pools"][0]
    assert (pool["lockable_cap_bytes"], pool["lockable_cap_known"]) == (8 * MIB, True)
    [host] = proposal["devices"]
    assert (host["name"], host["cpu"], host["prompt_ratio"], host["token_ratio"]) == (
        "CPU",
        True,
        1.0,
        1.0,
    )
    assert (host["status"], host["uses"]) == ("used", ["prompt", "tokens", "layers"])
    assert proposal["devices_none"] == "build" and "no backend" in proposal["devices_none_text"]
    assert "other:Q4_0" in proposal["warning"]
    assert all(d["label"] in proposal["explain"] for d in proposal["decisions"])
    assert "warning" not in plan(smol, facts(smol))  # LOC-PLAN-54: planned with none loaded
    json.dumps(proposal)  # every field is JSON


def test_decode_is_priced_by_bytes_or_compute_whichever_is_slower(smol: Shape) -> None:
    """LOC-PLAN-27 (the cost model): the bytes a token reads at the memory rate, or two FLOPs
    a parameter at the one-token matmul rate, the slower, plus a step's own cost; half the
    threads get half the rates."""
    settings = cost.Settings(threads=8, ctx_size=4096, batch_size=512, parallel=1, dtype="auto")
    read_bound = replace(EIGHT_CORES, copy_rate=1e9, token_flops=1e15)
    assert cost.decode_s(smol, read_bound, settings) == pytest.approx(
        smol.stored_bytes / 1e9 + cost.STEP_S
    )
    compute_bound = replace(EIGHT_CORES, copy_rate=1e15, token_flops=1e10)
    assert cost.decode_s(smol, compute_bound, settings) == pytest.approx(
        2 * smol.params / 1e10 + cost.STEP_S
    )
    half = replace(settings, threads=4)
    assert cost.decode_s(smol, compute_bound, half) == pytest.approx(
        2 * 2 * smol.params / 1e10 + cost.STEP_S
    )


def test_a_gpu_takes_the_layers(smol: Shape) -> None:
    """LOC-PLAN-26, LOC-PLAN-30 (with a usable device the plan offloads every layer and the
    tokens lane names it)."""
    found = devices.Devices(
        (
            devices.Device(
                name="cuda:0",
                description="Fake GPU",
                memory_total=8 * GB,
                prompt_ratio=10.0,
                token_ratio=10.0,
                status="unused",
                why="",
            ),
        ),
        "",
    )
    proposal = propose(Subject(model_id="smol", engine=smol.engine), facts(smol, gpu=True), found)
    assert proposal["values"]["n-gpu-layers"] == 30 and proposal["regime"] == "gpu-full"
    assert proposal["summary"]["lanes"][1]["on"] == ["CPU", "Fake GPU"]
    assert proposal["devices"][1]["name"] == "cuda:0"


def test_without_a_backend_no_device_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOC-PLAN-39, LOC-PLAN-41: torch without CUDA or MPS and llama.cpp without GPU offload
    is `build`: nothing is asked (this machine's own build)."""
    monkeypatch.setattr(devices, "backends", lambda: [])
    assert devices.probe() == devices.Devices((), "build")


@pytest.mark.parametrize(
    ("child", "status", "why"),
    [
        ("import os; os.abort()", "unusable", "ended with status"),
        ("import time; time.sleep(30)", "unusable", "did not answer"),
        ("print('not json')", "unusable", "not JSON"),
    ],
    ids=["LOC-PLAN-07-crash", "LOC-PLAN-07-hang", "LOC-PLAN-07-garbage"],
)
def test_a_device_probe_that_fails_marks_the_device_unusable(
    monkeypatch: pytest.MonkeyPatch, child: str, status: str, why: str
) -> None:
    """LOC-PLAN-07, LOC-PLAN-38: the devices are asked in a child process; a driver that ends
    it, hangs it or garbles it marks the device `unusable` with why, and the server goes
    on (this test's process is the server)."""
    monkeypatch.setattr(devices, "backends", lambda: ["cuda"])
    found = devices.probe(command=[sys.executable, "-c", child], timeout_s=2.0)
    [device] = found.found
    assert device.status == status and why in device.why
    assert found.usable == ()


def test_a_child_that_finds_nothing_reads_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """LOC-PLAN-08, LOC-PLAN-39: a backend but no device is `machine`; with isolation off the
    devices are asked in process (here: torch without CUDA finds none)."""
    monkeypatch.setattr(devices, "backends", lambda: ["cuda"])
    assert devices.probe(command=[sys.executable, "-c", "print('[]')"]).none == "machine"
    assert devices.probe(isolated=False).none == "machine"
