"""The transformers engine on the real SmolLM2-135M-Instruct (Q4_1 GGUF)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from miserver.engines.base import ChatPrompt, Prefilled, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine, chat, load_transformers_engine
from miserver.serving.completions.detokenizer import Detokenizer
from miserver.serving.stops import StopMatcher
from tests.engines import ForwardLog, greedy, home_cache_dir, load_transformers, smollm2_gguf

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
LONG_ANSWER = [{"role": "user", "content": "Write a long essay about the history of Rome."}]


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    """SmolLM2, run on one torch thread while this module's tests run.

    A tiny model decodes about as fast on one thread as on two, and one
    thread does not stall when a shared CPU is busy (two OpenMP threads then
    wait on each other at every op), which kept this file's time steady.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loaded = load_transformers()
    yield loaded
    loaded.close()
    torch.set_num_threads(threads)


def ids_of(tokens: list[Token]) -> list[int]:
    return [token.token_id for token in tokens]


def tokens_of(items: Iterator[Prefilled | Token]) -> list[Token]:
    """The tokens of a generation, after checking it opens with exactly one Prefilled."""
    items = list(items)
    assert isinstance(items[0], Prefilled)
    assert all(isinstance(t, Token) for t in items[1:])
    return [t for t in items if isinstance(t, Token)]


# Loading and facts


def test_facts_are_honest(engine: TransformersEngine) -> None:
    """OAI-SEED-14, OAI-SEED-16, OAI-GGUF-01: facts from the GGUF, none guessed."""
    facts = engine.facts
    assert re.fullmatch(r"[0-9a-f]{8}", facts.revision)
    assert (facts.quantization, facts.dtype, facts.engine) == ("Q4_1", "float32", "transformers")
    assert facts.context_length == 8192
    assert facts.vocab_size == 49152
    assert facts.has_chat_template
    assert engine.capabilities == frozenset(
        {
            "generate",
            "chat",
            "seed",
            "steering",
            "scoring",
            "scoring_float32",
            "decide",
            "batched_chat",
            "embeddings",
            "structured_output",
            "tools",
            "sae_activations",
            "monitoring",
        }
    )


def test_a_converted_folder_loads_as_a_plain_hf_folder(engine: TransformersEngine) -> None:
    """OAI-GGUF-01: the cached folder is a complete HF checkpoint with its provenance."""
    folders = [p for p in home_cache_dir().glob("SmolLM2-135M-Instruct.Q4_1-*") if p.is_dir()]
    assert folders
    assert not list(home_cache_dir().glob(".SmolLM2-135M-Instruct.Q4_1-*"))
    again = load_transformers_engine(folders[0], model_id="again", cache_dir=home_cache_dir())
    assert again.facts.revision == engine.facts.revision
    again.close()


@pytest.fixture(scope="module")
def tiny_snapshot(engine: TransformersEngine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama in the hub cache layout, with no chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=engine.facts.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hub") / "snapshots" / ("0123abcd" * 5)
    LlamaForCausalLM(config).save_pretrained(folder)
    bare = copy.deepcopy(engine.tokenizer)
    bare.chat_template = None
    bare.save_pretrained(folder)
    return folder


def test_plain_hf_folder_facts(tiny_snapshot: Path, tmp_path: Path) -> None:
    """OAI-SEED-14, OAI-SEED-16: a hub snapshot's commit is the revision, else unrecorded."""
    snapshot = load_transformers_engine(tiny_snapshot, model_id="tiny", cache_dir=tmp_path)
    assert (snapshot.facts.revision, snapshot.facts.quantization) == ("0123abcd", "none")
    assert not snapshot.facts.has_chat_template
    (tmp_path / "plain").symlink_to(tiny_snapshot)
    plain = load_transformers_engine(tmp_path / "plain", model_id="tiny", cache_dir=tmp_path)
    assert plain.facts.revision == "unrecorded"
    assert not list(tmp_path.glob("*-*"))


def test_no_template_model_chats_within_its_window(tiny_snapshot: Path, tmp_path: Path) -> None:
    """OAI-TOKIDS-07, OAI-CHAT-18: ChatML fallback; generation never outgrows the window."""
    tiny = load_transformers_engine(tiny_snapshot, model_id="tiny", cache_dir=tmp_path)
    ids = tiny.render_chat(ChatPrompt(QUESTION))
    assert tiny.decode(ids).startswith("user\nName three colours")
    tokens = tokens_of(tiny.generate(ids, greedy(1000), None))
    assert len(tokens) <= 64 - len(ids)
    assert tokens[-1].eos or len(tokens) == 64 - len(ids)


def test_a_failed_conversion_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-GGUF-01: a crash mid-conversion leaves neither a half folder nor staging."""
    from miserver.engines.transformers import conversion

    fake = tmp_path / "fake.Q8_0.gguf"
    fake.write_bytes(b"GGUF" + bytes(range(256)) * 10)

    def crash(_path: Path, target: Path, _revision: str, _progress: object) -> None:
        (target / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(conversion, "_convert", crash)
    with pytest.raises(OSError, match="disk full"):
        conversion.cached_hf_folder(fake, tmp_path / "cache", lambda _message: None)
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_conversion_is_reused(engine: TransformersEngine) -> None:
    """OAI-GGUF-01: a GGUF converted once loads from its cached folder afterwards."""
    from miserver.engines.transformers import conversion

    messages: list[str] = []
    folder = conversion.cached_hf_folder(smollm2_gguf(), home_cache_dir(), messages.append)
    assert messages == [f"using converted folder {folder}"]
    provenance = conversion.read_provenance(folder)
    assert provenance is not None
    assert provenance.source == smollm2_gguf().name
    assert provenance.revision == engine.facts.revision


def test_close_drops_the_model() -> None:
    """Engines can be unloaded; a closed engine refuses further work."""
    closing = load_transformers()
    closing.close()
    with pytest.raises(RuntimeError):
        tokens_of(closing.generate([1, 2, 3], greedy(1), None))


# Tokenizing and chat rendering


def test_tokenize_and_decode_round_trip(engine: TransformersEngine) -> None:
    """OAI-TOKIDS-06: raw prompts keep add_special_tokens; decode skips specials."""
    ids = engine.tokenize("Hello, wörld 😀")
    assert engine.decode(ids) == "Hello, wörld 😀"
    assert engine.tokenize("hi", add_special_tokens=False) == engine.tokenize("hi")
    assert engine.decode([1, *ids, 2]) == "Hello, wörld 😀"


def test_chat_has_exactly_one_bos(engine: TransformersEngine) -> None:
    """OAI-TOKIDS-01, OAI-TOKIDS-02, OAI-TOKIDS-05: the template's BOS, no second."""
    ids = engine.render_chat(ChatPrompt(QUESTION))
    text = engine.tokenizer.apply_chat_template(
        QUESTION, tokenize=False, add_generation_prompt=True
    )
    assert ids == engine.tokenize(text, add_special_tokens=False)
    bos = engine.tokenizer.bos_token_id
    assert ids[0] == bos and ids[1] != bos
    assert engine.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


class StubTokenizer:
    """A tokenizer whose encode shows whether special tokens were asked for."""

    bos_token = "<s>"
    bos_token_id = 1

    def __init__(self, adds_bos: bool) -> None:
        self.adds_bos = adds_bos

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        body = [1 if text.startswith("<s>") else 7, 8, 9]
        return [1, *body] if add_special_tokens and self.adds_bos else body


@pytest.mark.parametrize(
    ("text", "adds_bos", "expected"),
    [
        ("<s>hello", True, [1, 8, 9]),  # OAI-TOKIDS-02: the template wrote the BOS
        ("hello", True, [1, 7, 8, 9]),  # OAI-TOKIDS-03: the tokenizer adds it
        ("hello", False, [7, 8, 9]),  # OAI-TOKIDS-04: a model without BOS
    ],
)
def test_bos_rule(text: str, adds_bos: bool, expected: list[int]) -> None:
    """OAI-TOKIDS-02, OAI-TOKIDS-03, OAI-TOKIDS-04, OAI-TOKIDS-05: one BOS at most."""
    tokenizer: Any = StubTokenizer(adds_bos)
    assert chat.tokenize_rendered(tokenizer, text) == expected


def test_no_chat_template_uses_chatml(engine: TransformersEngine) -> None:
    """OAI-TOKIDS-07: a model without a template gets ChatML, not a refusal."""
    bare = copy.deepcopy(engine.tokenizer)
    bare.chat_template = None
    text = chat.render_text(bare, ChatPrompt(QUESTION))
    assert text == (
        "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_content_parts_null_and_every_role(engine: TransformersEngine) -> None:
    """OAI-CHAT-04: system, user, assistant, tool, function; parts and null content."""
    messages = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        },
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "sunny"},
        {"role": "function", "name": "weather", "content": "warm"},
        {"role": "user", "content": "So?"},
    ]
    text = chat.render_text(engine.tokenizer, ChatPrompt(messages))
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    assert "<|im_start|>assistant\n<|im_end|>" in text
    assert "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>tool\nwarm<|im_end|>" in text
    assert text.endswith("<|im_start|>user\nSo?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError):
        chat.render_text(engine.tokenizer, ChatPrompt([{"role": "robot", "content": "x"}]))


def test_template_kwargs_reach_the_template(engine: TransformersEngine) -> None:
    """OAI-TOKIDS-01: chat_template_kwargs are template variables."""
    custom = copy.deepcopy(engine.tokenizer)
    custom.chat_template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    prompt = ChatPrompt([{"role": "user", "content": "x"}], template_kwargs={"greeting": "hey "})
    assert chat.render_text(custom, prompt) == "hey x"
    clash = ChatPrompt(prompt.messages, {"greeting": "", "add_generation_prompt": False})
    assert chat.render_text(custom, clash) == "x"


def test_trailing_assistant_message_is_continued(engine: TransformersEngine) -> None:
    """OAI-CONT-01, OAI-CONT-02, OAI-CONT-03, OAI-CONT-04, OAI-CONT-05: appended raw."""
    partial = "The three colours are red,"
    prompt = ChatPrompt([*QUESTION, {"role": "assistant", "content": partial}])
    ids = engine.render_chat(prompt)
    before = chat.render_text(engine.tokenizer, ChatPrompt(QUESTION))
    assert before.endswith("<|im_start|>assistant\n")
    assert ids == engine.tokenize(before + partial, add_special_tokens=False)
    text = engine.tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n" + partial)
    tokens = tokens_of(engine.generate(ids, greedy(8), None))
    assert not engine.decode(ids_of(tokens)).lstrip().startswith("The three colours")


# The decode loop


def test_greedy_matches_model_generate(engine: TransformersEngine) -> None:
    """OAI-CHAT-07: our KV-cache loop picks the same 32 greedy tokens as HF."""
    ids = engine.render_chat(ChatPrompt(LONG_ANSWER))
    ours = ids_of(tokens_of(engine.generate(ids, greedy(32), None)))
    inputs = torch.tensor([ids])
    with torch.inference_mode():
        reference = engine.model.generate(
            inputs, attention_mask=torch.ones_like(inputs), do_sample=False, max_new_tokens=32
        )
    assert len(ours) == 32
    assert ours == reference[0, len(ids) :].tolist()


def test_prompt_runs_once_then_one_token_per_pass(engine: TransformersEngine) -> None:
    """OAI-CHAT-07, LOC-CHAT-43: one pass over the uncached prompt, then one per new token."""
    ids = engine.render_chat(ChatPrompt(LONG_ANSWER))
    log = ForwardLog(engine.model)
    try:
        stream = engine.generate(ids, greedy(10), None)
        prefilled = next(stream)
        rest = list(stream)
    finally:
        log.remove()
    assert isinstance(prefilled, Prefilled)
    assert len(rest) == 10
    assert log.lengths == [len(ids) - prefilled.cached_tokens] + [1] * 9
    assert len(set(log.cache_ids)) == 1


def test_closing_stops_before_the_next_pass(engine: TransformersEngine) -> None:
    """OAI-STREAM-07: closing the stream runs no further pass."""
    ids = engine.render_chat(ChatPrompt(LONG_ANSWER))
    log = ForwardLog(engine.model)
    try:
        stream = engine.generate(ids, greedy(50), None)
        prefilled = next(stream)
        assert isinstance(prefilled, Prefilled)
        next(stream)
        next(stream)
        stream.close()
        assert log.lengths == [len(ids) - prefilled.cached_tokens, 1]
    finally:
        log.remove()


def test_max_tokens_and_eos(engine: TransformersEngine) -> None:
    """OAI-CHAT-17, OAI-STREAM-05: at most max_tokens; an EOS ends the stream."""
    ids = engine.render_chat(
        ChatPrompt([{"role": "user", "content": "What is the capital of France?"}])
    )
    assert len(tokens_of(engine.generate(ids, greedy(3), None))) == 3
    tokens = tokens_of(engine.generate(ids, greedy(64), None))
    assert len(tokens) < 64
    assert tokens[-1].eos and tokens[-1].token_id in engine.eos_ids
    assert not any(token.eos for token in tokens[:-1])


def test_same_seed_same_tokens(engine: TransformersEngine) -> None:
    """OAI-SEED-03, OAI-SEED-05, OAI-CHAT-13: same seed, prompt, params: same tokens."""
    ids = engine.render_chat(ChatPrompt(QUESTION))
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95)

    def run(seed: int) -> list[int]:
        return ids_of(tokens_of(engine.generate(ids, params, engine.new_rng(seed))))

    first = run(1234)
    assert run(1234) == first
    assert run(4321) != first


def test_greedy_ignores_the_seed(engine: TransformersEngine) -> None:
    """OAI-SEED-09: a seed changes nothing on a greedy request."""
    ids = engine.render_chat(ChatPrompt(QUESTION))
    seeded = tokens_of(engine.generate(ids, greedy(12), engine.new_rng(5)))
    assert seeded == tokens_of(engine.generate(ids, greedy(12), None))


def test_penalties_reduce_repetition(engine: TransformersEngine) -> None:
    """OAI-CHAT-22, OAI-CHAT-23, OAI-CHAT-24: penalties act as a repetition penalty."""
    ids = engine.render_chat(ChatPrompt(LONG_ANSWER))

    def repeats(frequency: float, presence: float) -> int:
        params = SamplingParams(
            max_tokens=32, temperature=0.0, frequency_penalty=frequency, presence_penalty=presence
        )
        out = ids_of(tokens_of(engine.generate(ids, params, None)))
        return len(out) - len(set(out))

    assert repeats(1.0, 1.0) < repeats(0.0, 0.0) < repeats(-1.0, -1.0)


def test_stream_text_with_stops(engine: TransformersEngine) -> None:
    """OAI-CHAT-20, OAI-CHAT-21, OAI-SEED-05: the stream equals the decode, cut at a stop."""
    ids = engine.render_chat(ChatPrompt(LONG_ANSWER))
    tokens = ids_of(tokens_of(engine.generate(ids, greedy(24), None)))
    full = engine.decode(tokens)
    detok = Detokenizer(engine.decode)
    streamed = "".join(detok.push(token_id) for token_id in tokens) + detok.flush()
    assert streamed == full
    stop = full.split()[5]
    matcher = StopMatcher([stop])
    released, matched = matcher.push(streamed)
    assert matched
    assert released == full[: full.index(stop)]
