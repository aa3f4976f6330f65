"""What /api/info reads off a model's own files: experts per token and thinking control."""

from __future__ import annotations

import json
from pathlib import Path

import gguf as gguf_lib
import pytest

from miserver.local.session import think_ctl
from miserver.models.experts import experts_used

TEMPLATES = Path(__file__).parent.parent / "data" / "templates"


def header_gguf(path: Path, arch: str, **keys: int) -> Path:
    """A GGUF with a header and no tensors, `keys` written under `<arch>.`."""
    writer = gguf_lib.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_expert_used_count(tmp_path: Path) -> None:
    """LOC-INFO-15: a GGUF's `<arch>.expert_used_count`; 0 for a dense model."""
    moe = header_gguf(tmp_path / "moe.gguf", "qwen3moe", expert_count=128, expert_used_count=8)
    dense = header_gguf(tmp_path / "dense.gguf", "llama", block_count=30)
    assert experts_used(moe) == 8
    assert experts_used(dense) == 0


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}, 2),
        ({"model_type": "llava", "text_config": {"num_experts_per_tok": 4}}, 4),
        ({"model_type": "llama"}, 0),
        ({"model_type": "odd", "num_experts_per_tok": True}, 0),
        ([1, 2], 0),
    ],
    ids=["top-level", "text_config", "dense", "not-a-count", "not-an-object"],
)
def test_hf_num_experts_per_tok(tmp_path: Path, config: object, expected: int) -> None:
    """LOC-INFO-15: an HF folder's `num_experts_per_tok` (or its `text_config`'s)."""
    (tmp_path / "config.json").write_text(json.dumps(config), "utf-8")
    assert experts_used(tmp_path) == expected


def test_unreadable_files_count_no_experts(tmp_path: Path) -> None:
    """LOC-INFO-15: a missing or broken file reads as dense, never as an error."""
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf")
    assert experts_used(tmp_path / "broken.gguf") == 0
    assert experts_used(tmp_path / "missing.gguf") == 0
    assert experts_used(tmp_path) == 0  # a folder with no config.json


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ((TEMPLATES / "qwen3.jinja").read_text("utf-8"), "template"),
        ("{{ messages }}<|im_start|>assistant\n<think>\n", "always"),
        ("{{ messages }}[THINK]", "always"),
        ((TEMPLATES / "llama3.jinja").read_text("utf-8"), "none"),
        (None, "none"),
    ],
    ids=["enable_thinking", "think-span", "mistral-span", "no-span", "no-template"],
)
def test_think_ctl(template: str | None, expected: str) -> None:
    """LOC-INFO-14, REQ-003 open point 15: `template` only when the template reads
    `enable_thinking`; `always` when it writes a span it cannot turn off; else `none`."""
    assert think_ctl(template) == expected
