"""What a remote GGUF model is, and what this machine can do with it (REQ-003 HFI).

`model_facts` reads the headers a range request fetched (every shard's first
HEADER_BYTES): the architecture, the role by the rules of GET /api/models, the
block and expert counts, and the tensor bytes summed by name (`*_exps` tensors
are experts; the rest is dense). `Machine` is this machine as measured once per
inspect (LOC-HFI-25): memory, the resident model's share, the models
directory's free disk. `verdict` sets the two against each other, in sentences
a UI shows as they are.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..engines import gguf
from .listing import gguf_role

HEADER_BYTES = 48 << 20  # the key/value header and tensor infos of any GGUF we know
FIRST_SPAN = 1 << 20  # a header's first read; each next one reads as much again, and more
MARGIN = 512 << 20  # memory this process keeps for itself beyond the weights
MIB = 1 << 20
_BLOCK = re.compile(r"^blk\.(\d+)\.")
ROLE_SENTENCES = {
    "projector": "a projector (it turns images into a model's input), not a model on its own",
    "draft": "a draft head (it predicts tokens ahead for another model), not a model on its own",
    "other": "not a language model",
}


def _empty() -> dict[str, Any]:
    return {
        "readable": False,
        "arch": "",
        "role": "",
        "type": "",
        "block_count": 0,
        "is_moe": False,
        "n_expert": 0,
        "n_expert_used": 0,
        "n_layer": 0,
        "n_moe_layer": 0,
        "n_embd": 0,
        "dense_bytes": 0,
        "expert_bytes": 0,
        "token_cycle_bytes": 0,
        "largest_dense_tensor": 0,
        "has_mtp": False,
        "streamable": False,
        "refusal": "",
    }


def meta_int(meta: dict[str, Any], key: str) -> int:
    """A header's integer at `key`; 0 when absent or not an integer (a bool is not one)."""
    value = meta.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def cut(head: bytes) -> bool:
    """Whether `head`, a file's first bytes, stops inside its GGUF header (more of them would
    let it parse); False once it parses, or when it never will."""
    try:
        gguf.read_header(io.BytesIO(head))
    except gguf.HeaderCut:
        return True
    except (gguf.NotGGUF, ValueError, KeyError, OverflowError, MemoryError):
        return False
    return False


def model_facts(headers: Sequence[bytes]) -> dict[str, Any]:
    """`model` of the answer: `readable: false` and the rest empty when a header does not
    parse (LOC-HFI-05..11)."""
    try:
        parsed = [gguf.read_header(io.BytesIO(head)) for head in headers]
    except (gguf.NotGGUF, ValueError, KeyError, OverflowError, MemoryError):
        return _empty()
    return header_facts(parsed[0][0], [t for _, infos in parsed for t in infos])


def header_facts(meta: dict[str, Any], tensors: Sequence[gguf.TensorInfo]) -> dict[str, Any]:
    """`model` from a parsed header: the first shard's keys, every shard's tensor infos (the
    planner's model probe reads a local file's through here too, LOC-HFI-03)."""
    facts = _empty()
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""
    kind = meta.get("general.type")
    experts = [t for t in tensors if "_exps" in t.name]
    dense = [t for t in tensors if "_exps" not in t.name]
    n_expert = meta_int(meta, f"{arch}.expert_count")
    n_used = meta_int(meta, f"{arch}.expert_used_count")
    dense_bytes = sum(t.bytes for t in dense)
    expert_bytes = sum(t.bytes for t in experts)
    cycle = dense_bytes + (expert_bytes * n_used // n_expert if n_expert else expert_bytes)
    moe_layers = {m.group(1) for t in experts if (m := _BLOCK.match(t.name))}
    return facts | {
        "readable": True,
        "arch": arch,
        "role": gguf_role(meta),
        "type": kind if isinstance(kind, str) else "",
        "block_count": meta_int(meta, f"{arch}.block_count"),
        "is_moe": n_expert > 1,
        "n_expert": n_expert,
        "n_expert_used": n_used,
        "n_layer": meta_int(meta, f"{arch}.block_count"),
        "n_moe_layer": len(moe_layers),
        "n_embd": meta_int(meta, f"{arch}.embedding_length"),
        "dense_bytes": dense_bytes,
        "expert_bytes": expert_bytes,
        "token_cycle_bytes": cycle,
        "largest_dense_tensor": max((t.bytes for t in dense), default=0),
        "has_mtp": meta_int(meta, f"{arch}.nextn_predict_layers") > 0,
    }


def present_bytes(files: Sequence[tuple[str, int]], models_dir: Path) -> int:
    """What of the model is in the models directory already, complete (LOC-HFI-13)."""
    found = 0
    for name, size in files:
        path = models_dir / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size == size:
            found += size
    return found


@dataclass(frozen=True, slots=True)
class Machine:
    """This machine for one inspect: measured once, with the resident model still loaded."""

    models_dir: Path
    loaded_model: str  # the resident model's id, "" when none
    loaded_held: int = 0  # what a plan charged for it; 0: loaded without a plan

    def view(self, present: int) -> dict[str, Any]:
        memory = psutil.virtual_memory()
        budget = max(0, int(memory.available) - MARGIN)
        return {
            "residency_budget": budget,
            "budget_if_loaded": min(budget + self.loaded_held, int(memory.total)),
            "loaded_model": self.loaded_model,
            "loaded_held": self.loaded_held,
            "memory_total": int(memory.total),
            "disk_free": disk_free(self.models_dir),
            "present_bytes": present,
        }


def disk_free(folder: Path) -> int:
    """Free bytes where `folder` is, or will be: its nearest existing ancestor's disk."""
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def verdict(name: str, size: int, model: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """`verdict`: downloadable, mode, and the disk and memory sentences (LOC-HFI-14..24)."""
    need = max(0, size - int(machine["present_bytes"]))
    free = int(machine["disk_free"])
    disk = f"needs {need // MIB} MiB of disk; the models folder has {free // MIB} MiB free"
    fits_disk = need <= free
    role = model["role"]
    if model["readable"] and role not in ("model", ""):
        what = ROLE_SENTENCES.get(role, "not a model")
        return {
            "downloadable": False,
            "mode": "not a model",
            "disk": disk,
            "memory": f"{os.path.basename(name)} is {what}.",
        }
    if not model["readable"]:
        return {
            "downloadable": fits_disk,
            "mode": "not readable",
            "disk": disk,
            "memory": "The header could not be read, so its memory cannot be told.",
        }
    weights = int(model["dense_bytes"]) + int(model["expert_bytes"])
    budget = int(machine["budget_if_loaded"])
    fits = "fits" if weights <= budget else "does not fit"
    memory = (
        f"{fits}: its weights take {weights // MIB} MiB; {budget // MIB} MiB would be free to "
        "hold them"
    )
    loaded, held = machine["loaded_model"], int(machine["loaded_held"])
    if loaded and held:
        memory += f", counting the {held // MIB} MiB {loaded} holds now (a load unloads it)"
    elif loaded:
        memory += f" (measured with {loaded} loaded; a load unloads it first)"
    return {"downloadable": fits_disk, "mode": "plain mmap", "disk": disk, "memory": memory + "."}
