"""The models a run makes: seeded random Llamas of real models' shapes beside an in-process
word-level tokenizer, a random SAE in SAELens' layout, and miserver's loader over them."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from miserver.engines.base import LoadOptions
from miserver.engines.transformers import TransformersEngine, load_transformers_engine

from .report import Plan

SMOLLM2: dict[str, Any] = {  # SmolLM2-135M's shape
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
LLAMA_1B: dict[str, Any] = {  # Llama-3.2-1B's shape
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
PAD, BOS, EOS = 0, 1, 2
ROLES = ("user", "assistant", "system")
FIRST_WORD = len(SPECIALS) + len(ROLES)  # the id of `w000000`
WORDS = 40000  # prompts draw from the first words only (both vocabularies hold them)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SEED = 48
INIT = 0.1  # initializer_range: logits spread wide enough that near-ties are rare
SMALL_ID, SPEED_ID, SAE_ID = "smollm2-shape", "llama-1b-shape", "random-sae"
LAYER = 12  # the SAE's and the probe's layer
D_SAE = 2048


def word(index: int) -> str:
    return f"w{index:06d}"


def sentence(seed: int, count: int) -> str:
    """`count` words, the same for the same seed."""
    return " ".join(word((seed * 7919 + j * 104729) % WORDS) for j in range(count))


def chat(i: int) -> list[dict[str, str]]:
    """Prompt i: one user message of 6 + 3i words."""
    return [{"role": "user", "content": sentence(i + 1, 6 + 3 * i)}]


def tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Whole words of a `vocab_size` vocabulary: the specials, the role names, `w000000`..;
    decoding joins them with spaces, so distinct ids read as distinct text."""
    names = [*SPECIALS, *ROLES] + [word(i) for i in range(vocab_size - FIRST_WORD)]
    core = Tokenizer(WordLevel({name: i for i, name in enumerate(names)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(list(SPECIALS))
    made = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core,
        bos_token=SPECIALS[BOS],
        eos_token=SPECIALS[EOS],
        pad_token=SPECIALS[PAD],
        unk_token="<unk>",
    )
    made.chat_template = TEMPLATE
    return made


def build(
    folder: Path, shape: dict[str, Any], *, dtype: torch.dtype, device: torch.device, init: float
) -> PreTrainedModel:
    """A seeded random model of `shape` saved at `folder` with its tokenizer; returned."""
    config = LlamaConfig(
        **shape, initializer_range=init, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD
    )
    torch.manual_seed(SEED)
    with device:
        made = LlamaForCausalLM(config)
    model = cast(PreTrainedModel, made.to(dtype).eval())  # type: ignore[arg-type]
    model.save_pretrained(folder)
    tokenizer(shape["vocab_size"]).save_pretrained(folder)
    return model


def residual_norm(model: PreTrainedModel) -> float:
    """The median norm of layer LAYER's output over a prompt (the first position left out)."""
    ids = torch.tensor([[FIRST_WORD + i * 37 % WORDS for i in range(48)]], device=model.device)
    with torch.inference_mode():
        states = model(ids, output_hidden_states=True, use_cache=False).hidden_states
    return float(states[LAYER + 1][0, 1:].float().norm(dim=-1).median())


def write_sae(folder: Path, d_in: int, scale: float) -> dict[str, torch.Tensor]:
    """A random standard SAE in SAELens' layout at layer LAYER: decoder rows of norm `scale`
    (strength 1 adds a residual's worth), encoder columns giving O(1) pre-activations."""
    g = torch.Generator().manual_seed(SEED + 1)
    rows = torch.randn(D_SAE, d_in, generator=g)
    weights = {
        "W_enc": (torch.randn(d_in, D_SAE, generator=g) / scale).contiguous(),
        "W_dec": (rows / rows.norm(dim=1, keepdim=True) * scale).contiguous(),
        "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
        "b_dec": torch.randn(d_in, generator=g) * (0.01 * scale / math.sqrt(d_in)),
    }
    cfg = {
        "architecture": "standard",
        "d_in": d_in,
        "d_sae": D_SAE,
        "dtype": "float32",
        "apply_b_dec_to_input": True,
        "hook_name": f"blocks.{LAYER}.hook_resid_post",
        "hook_layer": LAYER,
        "model_name": SMALL_ID,
    }
    folder.mkdir(parents=True)
    (folder / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n", "utf-8")
    save_file(weights, str(folder / "sae_weights.safetensors"))
    return weights


def free(plan: Plan) -> None:
    gc.collect()
    if plan.gpu:
        torch.cuda.empty_cache()


def load(plan: Plan, folder: Path, device: torch.device, parallel: int = 1) -> TransformersEngine:
    """miserver's loader on `folder`, float32 on `device`, no prompt cache."""
    options = LoadOptions(
        device=str(device), dtype="float32", parallel=parallel, threads=plan.threads, cache_ram=0
    )
    engine = load_transformers_engine(
        folder, model_id=folder.name, cache_dir=plan.work / "cache", options=options
    )
    if engine.facts.device != str(device):
        engine.close()
        raise RuntimeError(f"asked for {device}, the loader placed it on {engine.facts.device}")
    return engine
