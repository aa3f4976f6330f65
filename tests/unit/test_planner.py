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
from miserver.planner.kernels import Ask, Kernels, run
from miserver.planner.machine import Host, Machine
from miserver.planner.proposal import Subject, propose, title, value_text
from miserver.planner.rules import Facts
from miserver.planner.shape import Shape, read
from tests.conftest import TIMING

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
    kernels=(
        Kernels(threads=1, token_rate=5e9, layer_s=5e-6, prompt_flops=50e9),
        Kernels(threads=4, token_rate=15e9, layer_s=8e-6, prompt_flops=200e9),
        Kernels(threads=8, token_rate=20e9, layer_s=10e-6, prompt_flops=400e9),
    ),
    kernels_why="",
    seconds=1.5,
)
NO_DEVICE = devices.Devices((), "build")

pytestmark = pytest.mark.xdist_group(TIMING)  # real kernel probes and hang timeouts


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
    """LOC-PLAN-11, LOC-PLAN-20, LOC-PLAN-22: the regime says how the model runs
    (`mmap-paged` when even the smallest window's ledger exceeds the memory), never declines
    streaming; the notes are the regime ("Run mode" for the Python regimes), the placement,
    the ledger and the storage rate, each under its title, and an unknown topic is titled
    from its key."""
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


def test_every_note_names_the_number_that_decided_it(smol: Shape) -> None:
    """Issue 47 item 5, LOC-PLAN-11: each note's brief names its number, the placement's too
    (the layers on the CPU, of the model's)."""
    proposal = plan(smol, facts(smol))
    notes = {d["knob"]: d for d in proposal["decisions"] if d["group"] == "notes"}
    placement = notes["placement"]
    n = smol.n_layer
    assert placement["value"] == n
    assert placement["value_text"] == f"{n} of {n} layers on the CPU"
    assert placement["brief"].startswith(f"{n} of {n} layers on the CPU: ")
    for note in notes.values():
        assert re.search(r"\d", note["brief"]), note


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


def test_decode_is_priced_from_the_engine_s_kernels(smol: Shape) -> None:
    """LOC-PLAN-27 (the cost model): the bytes a token multiplies at the kernel's timed rate,
    plus each layer's cost beyond its products, plus a step's own; a thread count between
    two timed ones reads the line between them, one outside them the nearest; a prompt
    runs at the prompt-wide rate, two FLOPs a parameter."""
    settings = cost.Settings(threads=8, ctx_size=4096, batch_size=512, parallel=1, dtype="auto")
    assert cost.decode_s(smol, EIGHT_CORES, settings) == pytest.approx(
        smol.stored_bytes / 20e9 + smol.n_layer * 10e-6 + cost.STEP_S
    )
    six = replace(settings, threads=6)
    assert cost.decode_s(smol, EIGHT_CORES, six) == pytest.approx(
        smol.stored_bytes / 17.5e9 + smol.n_layer * 9e-6 + cost.STEP_S
    )
    assert cost.decode_s(smol, EIGHT_CORES, replace(settings, threads=16)) == cost.decode_s(
        smol, EIGHT_CORES, settings
    )
    assert cost.prefill_tokens_per_s(smol, EIGHT_CORES, settings) == pytest.approx(
        400e9 / (2 * smol.params)
    )


def test_threads_are_the_fastest_timed_count(smol: Shape) -> None:
    """LOC-PLAN-15, LOC-PLAN-17, LOC-PLAN-19 (`threads` is measured): the count whose priced
    decode is fastest wins, even one thread of eight when more threads only add each layer's
    dispatch (as transformers' one-row products do on a small model); a count within 3 % of
    the fastest with more threads wins the tie, for the prompt's sake."""
    flat = replace(
        EIGHT_CORES,
        kernels=(
            Kernels(threads=1, token_rate=15e9, layer_s=300e-6, prompt_flops=90e9),
            Kernels(threads=8, token_rate=15e9, layer_s=600e-6, prompt_flops=600e9),
        ),
    )
    threads = _decision(plan(smol, facts(smol, flat)), "threads")
    assert (threads["value"], threads["source"]) == (1, "measured")
    assert "1 thread" in threads["brief"] and "on 8" in threads["brief"]
    assert "8 thread(s)" in threads["reason"] and "tokens/s" in threads["reason"]
    tied = replace(
        EIGHT_CORES,
        kernels=(
            Kernels(threads=1, token_rate=15e9, layer_s=300e-6, prompt_flops=90e9),
            Kernels(threads=8, token_rate=15e9, layer_s=310e-6, prompt_flops=600e9),
        ),
    )
    assert _decision(plan(smol, facts(smol, tied)), "threads")["value"] == 8


def test_without_kernel_timings_nothing_is_predicted(smol: Shape) -> None:
    """LOC-PLAN-27 (`s_per_token` absent when not predicted), LOC-PLAN-13: when the kernel
    probe did not come back, `threads` is one a physical core (`derived`, the reason says
    why), the plan has no price, and the summary says so."""
    blind = replace(EIGHT_CORES, kernels=(), kernels_why="the kernel probe ended with status -6")
    proposal = plan(smol, facts(smol, blind))
    threads = _decision(proposal, "threads")
    assert (threads["value"], threads["source"]) == (8, "derived")
    assert "status -6" in threads["reason"]
    assert proposal["predicted"] == {}
    assert "not predicted" in proposal["summary"]["sentence"]
    assert "not timed" in proposal["machine"]


def _decision(proposal: dict[str, Any], knob: str) -> dict[str, Any]:
    return next(d for d in proposal["decisions"] if d["knob"] == knob)


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
    host, gpu = proposal["memory"]["pools"]  # LOC-PLAN-30: the device's own pool
    assert [r["name"] for r in gpu["rows"]] == ["weights", "kv-cache"]
    assert [r["name"] for r in host["rows"]] == ["compute"]
    assert (gpu["name"], gpu["cap_bytes"]) == ("cuda:0", 8 * GB)
    assert gpu["held_bytes"] == sum(r["bytes"] for r in gpu["rows"])
    assert "estimated" not in gpu  # LOC-PLAN-34: one device, its own figures


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


def test_the_shape_names_the_matrices_a_token_multiplies(smol: Shape, tmp_path: Path) -> None:
    """LOC-PLAN-04 (the model probe reads the header alone): a GGUF's middle block gives the
    layer's matrices with their ggml types, and the output matrix is the embeddings when
    they are tied; an HF folder's `config.json` gives the same shapes."""
    q4_1, q8_0 = 3, 8
    assert sorted(smol.layer) == sorted(
        [
            (576, 576, q4_1),
            (192, 576, q4_1),
            (192, 576, q4_1),
            (576, 576, q4_1),
            (1536, 576, q4_1),
            (1536, 576, q4_1),
            (576, 1536, q4_1),
        ]
    )
    assert smol.head == (49152, 576, q8_0)
    folder = tmp_path / "smol"
    folder.mkdir()
    config = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    shaped = read(folder, EngineId.TRANSFORMERS)
    assert sorted((r, w) for r, w, _ in shaped.layer) == sorted((r, w) for r, w, _ in smol.layer)
    assert shaped.head == (49152, 576, 0)
    ask = shaped.ask((1, 2), "auto")  # auto: float32 on the CPU, as the engine loads it
    assert (ask.engine, ask.dtype, ask.threads) == ("transformers", "float32", (1, 2))
    assert shaped.ask((1, 2), "bfloat16").dtype == "bfloat16"
    assert ask.n_layer == 30
    assert Ask.from_json(ask.to_json()) == ask


@pytest.mark.parametrize(
    "engine", [EngineId.LLAMACPP, EngineId.TRANSFORMERS], ids=["llama.cpp", "transformers"]
)
def test_the_kernels_are_timed_on_this_machine(gguf_path: Path, engine: EngineId) -> None:
    """LOC-PLAN-04, LOC-PLAN-05, LOC-PLAN-27: the real kernel probe, once on this machine,
    in its child (`miserver serve --probe-kernels`): llama.cpp's ggml on the file's own
    quantized types, torch's `linear` and the architecture built narrow on transformers;
    every figure positive and in a range a CPU reaches."""
    ask = read(gguf_path, engine).ask((1,), "auto")
    [timed] = Host().kernels(ask)[0]
    assert timed.threads == 1
    assert 1e8 < timed.token_rate < 1e12
    assert 0 < timed.layer_s < 0.05
    assert 1e8 < timed.prompt_flops < 1e14


@pytest.mark.parametrize(
    ("child", "why"),
    [
        ("import os; os.abort()", "ended with status"),
        ("import time; time.sleep(30)", "did not answer"),
        ("print('not json')", "not JSON"),
        ("print('[{}]')", "could not be read"),
    ],
    ids=["crash", "hang", "garbage", "short"],
)
def test_a_kernel_probe_that_fails_leaves_no_timings(
    monkeypatch: pytest.MonkeyPatch, child: str, why: str
) -> None:
    """LOC-PLAN-05, LOC-PLAN-27: a kernel probe that ends its process, hangs or garbles its
    answer leaves the machine without timings and says why; the server goes on (this test's
    process is the server)."""
    from miserver.planner import machine

    monkeypatch.setattr(machine, "KERNELS_TIMEOUT_S", 2.0)
    host = Host(command=[sys.executable, "-c", child, "--"])
    ask = Ask(engine="llama.cpp", threads=(1,), layer=((64, 64, 0),), head=None, n_layer=1, width=1)
    found, said = host.kernels(ask)
    assert found == () and why in said


def test_kernels_run_in_process_without_isolation() -> None:
    """LOC-PLAN-08 (`--no-isolated-probes` runs the probes in process): a tiny float32 layer
    on llama.cpp's kernels, timed here."""
    tiny = ((64, 64, 0),)
    ask = Ask(engine="llama.cpp", threads=(1,), layer=tiny, head=(128, 64, 0), n_layer=2, width=64)
    [timed] = Host(isolated=False).kernels(ask)[0]
    assert timed.token_rate > 0 and timed.prompt_flops > 0
    assert run(ask)[0].threads == 1


def test_every_word_comes_from_the_server(smol: Shape) -> None:
    """LOC-PLAN-16 (a note's `brief` is its `reason` when the reason is short enough),
    LOC-PLAN-23 (every label, badge, rate text, why and sentence is the server's own, and
    every list as long as the machine makes it: one device, the host, on this one),
    LOC-PLAN-33 (the compute buffers alone are `in_turn`)."""
    proposal = plan(smol, facts(smol))
    for d in proposal["decisions"]:
        assert d["label"] and d["value_text"] and d["brief"] and d["reason"], d
        if d["group"] == "notes" and len(d["reason"]) <= 120:
            assert d["brief"] == d["reason"]
    [host] = proposal["devices"]
    assert all(host[k] for k in ("description", "rate_text", "badge", "why"))
    assert "GiB/s on this model's matmul" in host["rate_text"]
    assert all(lane["label"] for lane in proposal["summary"]["lanes"])
    [pool] = proposal["memory"]["pools"]
    assert pool["label"] and all(r["label"] for r in pool["rows"])
    assert [r["in_turn"] for r in pool["rows"]] == [False, False, True]


def test_a_lock_asked_is_unverified_and_changes_no_figure(smol: Shape) -> None:
    """LOC-PLAN-32: `mlock` asked for is a runtime request: the pool says
    `cache_lock_unverified`, nothing is counted locked, no row is shown locked, and the
    capacity is the same as without it."""
    locked = plan(smol, facts(smol, values=base(mlock=True), user_keys={"mlock"}))
    unlocked = plan(smol, facts(smol, values=base(mlock=False), user_keys={"mlock"}))
    [pool], [plain] = locked["memory"]["pools"], unlocked["memory"]["pools"]
    assert pool["cache_lock_unverified"] and not plain["cache_lock_unverified"]
    assert pool["locked_bytes"] == 0 and not any(r["locked"] for r in pool["rows"])
    assert (pool["cap_bytes"], pool["lockable_cap_bytes"]) == (
        plain["cap_bytes"],
        plain["lockable_cap_bytes"],
    )


def test_args_are_empty_only_when_the_plan_changes_nothing(smol: Shape) -> None:
    """LOC-PLAN-44 (→ no streaming to decline: `args` is empty only when the plan sets
    nothing), LOC-PLAN-01 (this build has the planner: `available` is true, never the
    `available: false` of a build without one)."""
    every = {row.key for row in table()}
    proposal = plan(smol, facts(smol, user_keys=every))
    assert proposal["values"] == {} and proposal["args"] == []
    assert proposal["available"] is True and proposal["streaming_declined"] is False
    assert plan(smol, facts(smol))["args"] != []


def _card(memory: int) -> devices.Device:
    return devices.Device(
        name="cuda:0",
        description="Fake H100",
        memory_total=memory,
        prompt_ratio=40.0,
        token_ratio=12.0,
        status="unused",
        why="",
    )


@pytest.fixture(scope="module")
def smol_hf(gguf_path: Path) -> Shape:
    return read(gguf_path, EngineId.TRANSFORMERS)


def test_a_gpu_takes_a_transformers_model(smol_hf: Shape) -> None:
    """Issue 48 item 3: with a CUDA card the plan puts a transformers model on it, in
    bfloat16, with as many rows as the card's KV room holds at a full window (at most 32),
    its weights and KV in the card's own pool (LOC-PLAN-30) and the card on the lanes."""
    card = _card(80 * GB)
    found = devices.Devices((card,), "")
    on_card = replace(facts(smol_hf, gpu=True), card=card)
    proposal = propose(Subject(model_id="smol", engine=smol_hf.engine), on_card, found)
    values = proposal["values"]
    assert (values["device"], values["dtype"], values["parallel"]) == ("cuda", "bfloat16", 32)
    assert values["ctx-size"] == smol_hf.n_ctx_train and proposal["regime"] == "gpu-full"
    assert "cuda:0, Fake H100: 74 GiB" in _decision(proposal, "device")["brief"]
    assert "32 rows" in _decision(proposal, "parallel")["brief"]
    assert proposal["summary"]["lanes"][1]["on"] == ["CPU", "Fake H100"]
    _, gpu = proposal["memory"]["pools"]
    assert [r["name"] for r in gpu["rows"]] == ["weights", "kv-cache"]
    assert (
        gpu["cap_bytes"] == 80 * GB and "30 on the GPU" in _decision(proposal, "placement")["brief"]
    )


def test_a_small_card_gets_fewer_rows_and_a_shorter_window(smol_hf: Shape) -> None:
    """Issue 48 item 3: the rows and the window are what the card's share holds beside the
    weights, each brief naming the number that decided it."""
    card = _card(smol_hf.weight_bytes("bfloat16") + 64 * MIB)
    on_card = replace(facts(smol_hf, gpu=True), card=card)
    found = devices.Devices((card,), "")
    proposal = propose(Subject(model_id="smol", engine=smol_hf.engine), on_card, found)
    values = proposal["values"]
    per_token = smol_hf.kv_bytes_per_token("bfloat16")
    room = int(card.memory_total * 0.9) - smol_hf.weight_bytes("bfloat16")
    assert values["ctx-size"] == min(smol_hf.n_ctx_train, room // per_token // 256 * 256)
    assert values["parallel"] == max(1, min(32, room // (per_token * values["ctx-size"])))
    assert values["parallel"] < 32


def test_without_a_card_transformers_runs_on_the_cpu_in_float32(smol_hf: Shape) -> None:
    """Issue 48: no CUDA device, so the CPU, in float32 (what `auto` loads there)."""
    proposal = plan(smol_hf, facts(smol_hf))
    assert (proposal["values"]["device"], proposal["values"]["dtype"]) == ("cpu", "float32")
    assert proposal["regime"] != "gpu-full"
