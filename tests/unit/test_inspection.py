"""What a remote GGUF header says, and the verdict sentences against a machine (REQ-003 HFI).

Headers are real GGUF files written with the `gguf` package (the writer llama.cpp's own
converters use), cut to their first bytes as a range request would fetch them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import psutil

from miserver.models.inspection import MIB, Machine, model_facts, verdict


def header(arch: str, *, blocks: int, keys: dict[str, int], tensors: dict[str, int]) -> bytes:
    """A GGUF file's bytes: `tensors` maps a name to its float32 element count."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        writer = gguf.GGUFWriter(str(path), arch=arch)
        writer.add_type("model")
        writer.add_block_count(blocks)
        writer.add_embedding_length(64)
        for key, value in keys.items():
            writer.add_uint32(f"{arch}.{key}", value)
        for name, count in tensors.items():
            writer.add_tensor(name, np.zeros(count, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def test_a_moe_header_splits_dense_and_expert_bytes() -> None:
    """LOC-HFI-03, LOC-HFI-06, LOC-HFI-08, LOC-HFI-09, LOC-HFI-10, LOC-HFI-11: tensors named
    `*_exps` are experts and the rest dense; `token_cycle_bytes` is dense + experts ×
    used / count; `largest_dense_tensor` from the tensor infos; `has_mtp` from
    `nextn_predict_layers`; `streamable` is always false with no refusal (the engines run
    any supported model plainly)."""
    data = header(
        "qwen3moe",
        blocks=2,
        keys={"expert_count": 8, "expert_used_count": 2, "nextn_predict_layers": 1},
        tensors={
            "token_embd.weight": 1000,
            "blk.0.attn_q.weight": 300,
            "blk.0.ffn_up_exps.weight": 800,
            "blk.1.ffn_up_exps.weight": 800,
        },
    )
    facts = model_facts([data[: len(data) - 4 * 2900]])  # the header, not all the data
    assert facts["readable"] and (facts["arch"], facts["role"], facts["type"]) == (
        "qwen3moe",
        "model",
        "model",
    )
    assert (facts["is_moe"], facts["n_expert"], facts["n_expert_used"]) == (True, 8, 2)
    assert (facts["block_count"], facts["n_layer"], facts["n_moe_layer"], facts["n_embd"]) == (
        2,
        2,
        2,
        64,
    )
    assert (facts["dense_bytes"], facts["expert_bytes"]) == (4 * 1300, 4 * 1600)
    assert facts["token_cycle_bytes"] == 4 * 1300 + 4 * 1600 * 2 // 8
    assert facts["largest_dense_tensor"] == 4 * 1000
    assert (facts["has_mtp"], facts["streamable"], facts["refusal"]) == (True, False, "")


def test_a_dense_header_has_no_experts_and_no_mtp() -> None:
    """LOC-HFI-06, LOC-HFI-09, LOC-HFI-10: a dense model's cycle is all its bytes."""
    data = header("llama", blocks=1, keys={}, tensors={"token_embd.weight": 10})
    facts = model_facts([data])
    assert (facts["is_moe"], facts["n_expert"], facts["expert_bytes"]) == (False, 0, 0)
    assert facts["token_cycle_bytes"] == facts["dense_bytes"] == 40
    assert facts["has_mtp"] is False


def test_a_header_that_does_not_parse_leaves_the_model_empty() -> None:
    """LOC-HFI-05: `readable: false` and every other fact empty."""
    facts = model_facts([b"GGUF\x03\x00\x00\x00" + b"\xff" * 40])
    assert facts["readable"] is False
    assert all(not v for k, v in facts.items() if k != "readable")
    cut = header("llama", blocks=1, keys={}, tensors={"token_embd.weight": 10})[:30]
    assert model_facts([cut])["readable"] is False


def _machine(**changes: Any) -> dict[str, Any]:
    base = {
        "residency_budget": 1000 * MIB,
        "budget_if_loaded": 1000 * MIB,
        "loaded_model": "",
        "loaded_held": 0,
        "memory_total": 4000 * MIB,
        "disk_free": 5000 * MIB,
        "present_bytes": 0,
    }
    return base | changes


MODEL = {"readable": True, "role": "model", "dense_bytes": 600 * MIB, "expert_bytes": 0}


def test_the_memory_verdict_names_what_the_loaded_model_holds() -> None:
    """LOC-HFI-19, LOC-HFI-21, LOC-HFI-23: set against `budget_if_loaded`, counting that a load
    unloads the model loaded now; with `loaded_held` above 0 the sentence names that model
    and its share of the figure."""
    held = _machine(
        residency_budget=400 * MIB,
        budget_if_loaded=900 * MIB,
        loaded_model="qwen:Q4_K_M",
        loaded_held=500 * MIB,
    )
    said = verdict("m.gguf", 600 * MIB, MODEL, held)
    assert said["memory"] == (
        "fits: its weights take 600 MiB; 900 MiB would be free to hold them, counting the "
        "500 MiB qwen:Q4_K_M holds now (a load unloads it)."
    )
    short = verdict("m.gguf", 600 * MIB, MODEL, held | {"budget_if_loaded": 500 * MIB})
    assert short["memory"].startswith("does not fit: its weights take 600 MiB; 500 MiB")


def test_a_model_loaded_without_a_plan_leaves_the_measured_figure() -> None:
    """LOC-HFI-22, LOC-HFI-24: loaded without a plan, `loaded_held` is 0, the figure is the one
    measured, and the sentence says it was measured with that model loaded."""
    loaded = _machine(loaded_model="smollm2:Q4_1")
    said = verdict("m.gguf", 600 * MIB, MODEL, loaded)
    assert said["memory"] == (
        "fits: its weights take 600 MiB; 1000 MiB would be free to hold them (measured with "
        "smollm2:Q4_1 loaded; a load unloads it first)."
    )


def test_downloadable_follows_the_disk_only(tmp_path: Path) -> None:
    """LOC-HFI-13, LOC-HFI-14, LOC-HFI-17, LOC-HFI-18: `downloadable` is false only when the disk
    cannot take what is still to download (present bytes count); a model too big for memory
    is still downloadable."""
    big = verdict("m.gguf", 6000 * MIB, MODEL | {"dense_bytes": 6000 * MIB}, _machine())
    assert (big["downloadable"], big["mode"]) == (False, "plain mmap")
    assert big["disk"] == "needs 6000 MiB of disk; the models folder has 5000 MiB free"
    present = verdict("m.gguf", 6000 * MIB, MODEL, _machine(present_bytes=2000 * MIB))
    assert present["downloadable"] and present["disk"].startswith("needs 4000 MiB")
    huge = verdict("m.gguf", 10 * MIB, MODEL | {"dense_bytes": 9000 * MIB}, _machine())
    assert huge["downloadable"] and huge["memory"].startswith("does not fit")


def test_the_machine_is_measured_with_the_budget_capped_at_total(tmp_path: Path) -> None:
    """LOC-HFI-12, LOC-HFI-20, LOC-HFI-21: the budget is available memory less a margin;
    `budget_if_loaded` adds what the loaded model holds, at most `memory_total`."""
    view = Machine(tmp_path, "m", loaded_held=1 << 60).view(0)
    memory = psutil.virtual_memory()
    assert set(view) == {
        "residency_budget",
        "budget_if_loaded",
        "loaded_model",
        "loaded_held",
        "memory_total",
        "disk_free",
        "present_bytes",
    }
    assert 0 < view["residency_budget"] < memory.total
    assert view["budget_if_loaded"] == view["memory_total"] == memory.total
    plain = Machine(tmp_path, "").view(0)
    assert plain["budget_if_loaded"] == plain["residency_budget"]
