"""The llama.cpp engine on the real SmolLM2-135M-Instruct (Q4_1 GGUF)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from jsonschema import Draft202012Validator
from llama_cpp import _internals

from miserver.engines import gguf
from miserver.engines.base import (
    ChatPrompt,
    Constraint,
    ConstraintUnsupported,
    LoadOptions,
    Prefilled,
    PromptError,
    SamplingParams,
    Token,
)
from miserver.engines.llamacpp import CAPABILITIES, LlamaCppEngine, load_llamacpp_engine
from miserver.engines.llamacpp import chat as llama_chat
from miserver.engines.llamacpp import loading as llamacpp_loading
from miserver.engines.llamacpp.sampling import Greedy, Logits, Penalties
from miserver.engines.transformers.grammar import Grammars
from miserver.serving.completions.detokenizer import Detokenizer
from miserver.serving.stops import StopMatcher
from tests.conftest import ONE_THREAD
from tests.engines import greedy, run, smollm2_gguf
from tests.structured import VERDICT

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
LONG_ANSWER = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
SUM = [{"role": "user", "content": "What is 2+2?"}]  # answered in a dozen tokens
ALL_ROLES = [
    {
        "role": "system",
        "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
    },
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": None, "tool_calls": None},
    {"role": "tool", "content": "sunny"},
    {"role": "function", "name": "weather", "content": "warm"},
    {"role": "user", "content": "So?"},
]
CHATS = {
    "question": QUESTION,
    "system": [{"role": "system", "content": "You answer in French."}, *CAPITAL],
    "turns": [*QUESTION, {"role": "assistant", "content": "Red, green, blue."}, *CAPITAL],
    "all-roles": ALL_ROLES,
    "continuation": [*QUESTION, {"role": "assistant", "content": "The three colours are red,"}],
    "unicode": [{"role": "user", "content": 'Grüße 😀 <b>&amp;</b> "quotes"\n\ttabs'}],
}


def load(ctx_size: int = 0, **kwargs: Any) -> LlamaCppEngine:
    """SmolLM2 on one thread: a tiny model decodes about as fast on one as on two, and
    one thread does not stall when a shared CPU is busy (threads waiting on each other).
    No prompt cache (issue 43, tests/integration/test_prompt_cache_llamacpp.py): these tests
    are the one kept context's (LOC-CHAT-43..48)."""
    options = LoadOptions(threads=1, ctx_size=ctx_size, cache_ram=0)
    return load_llamacpp_engine(smollm2_gguf(), model_id="smollm2:Q4_1", options=options, **kwargs)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    loaded = load()
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def bare() -> Iterator[llama_cpp.Llama]:
    """A plain `Llama` on the same file and window: the reference."""
    llama = llama_cpp.Llama(
        model_path=str(smollm2_gguf()),
        n_ctx=8192,
        n_threads=1,
        n_threads_batch=1,
        flash_attn=True,  # as the engine loads it (loading.py)
        verbose=False,
    )
    yield llama
    llama.close()


@pytest.fixture(scope="module")
def hf_engine() -> Iterator[Any]:
    """The transformers engine on the same file (its converted folder is cached)."""
    from miserver.engines.transformers import load_transformers_engine

    cache = Path(os.environ.get("MISERVER_CACHE_DIR") or Path.home() / ".cache" / "miserver")
    loaded = load_transformers_engine(
        smollm2_gguf(), model_id="x", cache_dir=cache, options=ONE_THREAD
    )
    yield loaded
    loaded.close()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def render(engine: LlamaCppEngine, messages: list[dict[str, Any]]) -> list[int]:
    return engine.render_chat(ChatPrompt(messages))


# Loading and facts


def test_facts_are_honest(engine: LlamaCppEngine) -> None:
    """OAI-GGUF-01, OAI-SEED-14, OAI-SEED-16: facts from the file, the dtype not guessed;
    its capabilities those of the protocols it implements."""
    facts = engine.facts
    assert re.fullmatch(r"[0-9a-f]{8}", facts.revision)
    assert facts.revision == gguf.fingerprint(smollm2_gguf())[:8]
    assert (facts.engine, facts.quantization, facts.dtype) == ("llama.cpp", "Q4_1", "unrecorded")
    assert (facts.context_length, facts.vocab_size) == (8192, 49152)
    assert facts.has_chat_template and facts.owned_by == "local"
    assert (
        engine.capabilities
        == CAPABILITIES
        == frozenset(
            {
                "generate",
                "chat",
                "decide",
                "embeddings",
                "seed",
                "structured_output",
                "tools",
                "scoring",  # contract 0.17.0 (docs/DECISIONS.md): native precision only
                "batched_chat",  # by the protocol; the field matrix refuses extra_messages
                "steering",  # contract 0.25.0: the control vector (issue 46)
                "sae_activations",  # contract 0.26.0: the evaluation callback (tap.py)
                "monitoring",
            }
        )
    )
    assert engine.scoring_precisions == frozenset({"native"})


def test_unloadable_files_raise(tmp_path: Path) -> None:
    """OAI-ERR-32: a file llama.cpp cannot load raises (the caller maps it to model_load_failed)."""
    not_gguf = tmp_path / "junk.Q4_1.gguf"
    not_gguf.write_bytes(b"not a model at all")
    with pytest.raises(gguf.NotGGUF):
        load_llamacpp_engine(not_gguf, model_id="junk")
    truncated = tmp_path / "cut.Q4_1.gguf"
    with smollm2_gguf().open("rb") as source:
        truncated.write_bytes(source.read(4 << 20))  # the whole header, few weights
    with pytest.raises(ValueError, match="Failed to load model"):
        load_llamacpp_engine(truncated, model_id="cut")


# Tokenizing and decoding


def test_tokenize_and_decode(engine: LlamaCppEngine, hf_engine: Any) -> None:
    """OAI-TOKIDS-06: raw prompts keep add_special_tokens; decode leaves special tokens out."""
    ids = engine.tokenize("Hello, wörld 😀")
    assert ids == hf_engine.tokenize("Hello, wörld 😀")
    assert engine.decode(ids) == "Hello, wörld 😀"
    assert engine.tokenize("hi", add_special_tokens=False) == engine.tokenize("hi")  # no BOS added
    assert engine.tokenize("<|im_start|>user") == hf_engine.tokenize("<|im_start|>user")
    mixed = [1, *ids, 2, 0, 4, 17]
    assert engine.decode(mixed) == hf_engine.decode(mixed) == "Hello, wörld 😀!"
    assert engine.decode([]) == ""
    for bad in ([-1], [49152], [5, 10**9]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.decode(bad)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            next(engine.generate(bad, greedy(1), None))


def test_a_cut_character_decodes_to_a_replacement(engine: LlamaCppEngine) -> None:
    """OAI-STREAM: an incomplete UTF-8 tail shows U+FFFD, which the detokenizer holds back."""
    ids = engine.tokenize("😀", add_special_tokens=False)
    assert len(ids) > 1
    assert engine.decode(ids[:-1]).endswith("\ufffd")
    detok = Detokenizer(engine.decode)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]


def test_long_pieces_decode_whole(engine: LlamaCppEngine) -> None:
    """Pieces longer than llama-cpp-python's 32-byte buffer decode in full."""
    text = "\n" + " " * 80  # one token of 81 bytes
    ids = engine.tokenize(text)
    assert len(ids) == 1
    assert engine.decode(ids) == text
    assert engine.decode(ids * 3 + engine.tokenize("x" * 70)) == text * 3 + "x" * 70


# Chat rendering


@pytest.mark.parametrize("name", sorted(CHATS))
def test_chat_ids_equal_the_transformers_engine(
    engine: LlamaCppEngine, hf_engine: Any, name: str
) -> None:
    """OAI-TOKIDS-01, OAI-CHAT-04, LOC-CHAT-36: the file's template, same ids on both engines."""
    prompt = ChatPrompt(CHATS[name])
    assert engine.render_chat(prompt) == hf_engine.render_chat(prompt)


def test_chat_has_exactly_one_bos(engine: LlamaCppEngine) -> None:
    """OAI-TOKIDS-02, OAI-TOKIDS-05: SmolLM2's template writes the BOS; no second one."""
    ids = render(engine, QUESTION)
    assert ids[0] == engine.template.bos_token_id == 1 and ids[1] != 1
    text = llama_chat.render_text(engine.template, ChatPrompt(QUESTION))
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(
        "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids == engine.tokenize(text, add_special_tokens=False)


class Tokenizer:
    """A tokenizer stub that shows whether special tokens were asked for."""

    def __init__(self, adds_bos: bool) -> None:
        self.adds_bos = adds_bos

    def __call__(self, text: str, add_special_tokens: bool) -> list[int]:
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
    template = llama_chat.ChatTemplate(None, {"bos_token": "<s>"}, 1)
    assert llama_chat.tokenize_rendered(template, Tokenizer(adds_bos), text) == expected
    no_bos = llama_chat.ChatTemplate(None, {}, None)
    assert llama_chat.tokenize_rendered(no_bos, Tokenizer(False), text)[1:] == [8, 9]


def test_no_chat_template_uses_chatml() -> None:
    """OAI-TOKIDS-07: a file without a template gets ChatML, as on transformers."""
    bare = llama_chat.ChatTemplate(None, {"bos_token": "<|im_start|>"}, 1)
    assert llama_chat.render_text(bare, ChatPrompt(QUESTION)) == (
        "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_and_a_forced_opening_reach_the_render(
    engine: LlamaCppEngine, hf_engine: Any
) -> None:
    """OAI-TOOLS-02, OAI-TOOLS-20, OAI-TOOLS-32, OAI-TOKIDS-01: tools go to the template, a
    forced call's opening follows the render (the same ids as transformers); the fallback
    template refuses tool history rather than drop it."""
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    source = "{% for t in tools %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}"
    listing = llama_chat.ChatTemplate(source, {}, None)
    prompt = ChatPrompt(QUESTION, tools=tools, opening="<call>")
    assert llama_chat.render_text(listing, prompt) == (
        "get_weather;Name three colours of the rainbow.<call>"
    )
    forced = ChatPrompt(QUESTION, tools=tools, opening='{"name": "get_weather", "arguments": ')
    assert engine.render_chat(forced) == hf_engine.render_chat(forced)
    history = [*QUESTION, {"role": "tool", "content": "sunny"}]
    bare = llama_chat.ChatTemplate(None, {"bos_token": "<|im_start|>"}, 1)
    with pytest.raises(PromptError):
        llama_chat.render_text(bare, ChatPrompt(history))


def test_template_variables_and_sandbox(engine: LlamaCppEngine) -> None:
    """LOC-CHAT-36: transformers' variables and helpers; reserved names are not overridden."""
    source = (
        "{{ bos_token }}{{ greeting }}{{ messages | tojson }}{{ strftime_now('%Y')|length }}"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{{ ns.n }}{{ add_generation_prompt }}{{ tools is none }}"
    )
    custom = llama_chat.ChatTemplate(source, engine.template.special_tokens, 1)
    prompt = ChatPrompt(
        [{"role": "user", "content": "<é>"}],
        template_kwargs={"greeting": "hey ", "add_generation_prompt": False},
    )
    text = llama_chat.render_text(custom, prompt)
    assert text == '<|im_start|>hey [{"role": "user", "content": "<é>"}]41TrueTrue'


@pytest.mark.parametrize(
    ("messages", "source"),
    [
        ([{"role": "assistant", "content": "alone"}], None),  # OAI-CONT: nothing to continue
        ([{"role": "robot", "content": "x"}], None),
        ([{"role": "user", "content": {"image": 1}}], None),
        ([{"role": "user", "content": [{"type": "image_url"}]}], None),
        (QUESTION, "{{ raise_exception('no users here') }}"),
        (QUESTION, "{% for m in messages %}"),  # a template that does not compile
        (QUESTION, "{{ messages.__class__.__mro__ }}"),  # the sandbox refuses it
    ],
)
def test_prompt_errors(
    engine: LlamaCppEngine, messages: list[dict[str, Any]], source: str | None
) -> None:
    """OAI-CONT-01, OAI-CHAT-04: chats the template cannot render are PromptErrors."""
    template = llama_chat.ChatTemplate(source, engine.template.special_tokens, 1)
    if source is None:
        template = engine.template
    with pytest.raises(PromptError):
        llama_chat.render_chat(template, lambda text, special: [1], ChatPrompt(messages))


def test_trailing_assistant_message_is_continued(engine: LlamaCppEngine) -> None:
    """OAI-CONT-01, OAI-CONT-02, OAI-CONT-03, OAI-CONT-04, OAI-CONT-05: appended raw."""
    partial = "The three colours are red,"
    ids = render(engine, [*QUESTION, {"role": "assistant", "content": partial}])
    before = llama_chat.render_text(engine.template, ChatPrompt(QUESTION))
    assert ids == engine.tokenize(before + partial, add_special_tokens=False)
    assert engine.decode(ids).endswith("assistant\n" + partial)
    _, tokens = run(engine, ids, greedy(8))
    assert not engine.decode(tokens).lstrip().startswith("The three colours")


# Generation


def test_greedy_matches_bare_llama(engine: LlamaCppEngine, bare: llama_cpp.Llama) -> None:
    """OAI-CHAT-07: our loop picks the same 32 greedy tokens as `Llama.create_completion`."""
    ids = render(engine, LONG_ANSWER)
    _, ours = run(engine, ids, greedy(32))
    bare.reset()
    reference = bare.create_completion(
        prompt=ids, temperature=0, max_tokens=32, top_k=0, min_p=0, top_p=1, repeat_penalty=1.0
    )
    assert len(ours) == 32
    assert engine.decode(ours) == reference["choices"][0]["text"]
    assert list(bare.input_ids[len(ids) : bare.n_tokens]) == ours[:-1]


def test_greedy_argmax_picks_what_llama_cpps_greedy_sampler_picks(
    bare: llama_cpp.Llama,
) -> None:
    """OAI-CHAT-07: `Greedy` (an argmax over the logits in place) picks llama.cpp's greedy
    sampler's token on real logits, and on a tie the first of the highest, as it does."""
    reference = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
    reference.add_greedy()  # type: ignore[no-untyped-call]
    ctx, logits = bare.ctx, Logits(bare.ctx, bare.n_vocab())
    try:
        for text in (b"The capital of France is", b"1, 2, 3,", b"def main("):
            bare.reset()
            bare.eval(bare.tokenize(text))
            theirs = int(llama_cpp.llama_sampler_sample(reference.sampler, ctx, -1))
            assert Greedy().pick(logits, -1) == theirs
            row = logits.row(-1)
            top = float(row.max()) + 1.0
            row[[4000, 17, 30000]] = top  # three tie for the highest
            assert int(llama_cpp.llama_sampler_sample(reference.sampler, ctx, -1)) == 17
            assert Greedy().pick(logits, -1) == 17
    finally:
        reference.close()  # type: ignore[no-untyped-call]


def test_max_tokens_and_end_of_generation(engine: LlamaCppEngine) -> None:
    """OAI-CHAT-17, OAI-STREAM-05: at most max_tokens; an EOG token ends and is marked."""
    ids = render(engine, SUM)
    assert len(run(engine, ids, greedy(3))[1]) == 3
    items = list(engine.generate(ids, greedy(64), None))
    last = items[-1]
    assert isinstance(last, Token) and last.eos and len(items) < 65
    assert engine.context.is_eog(last.token_id)
    assert {t for t in (0, 2, 4) if engine.context.is_eog(t)} == {0, 2, 4}  # not only token_eos


def test_sampling_takes_temperature_and_top_p(engine: LlamaCppEngine) -> None:
    """OAI-CHAT-07: temperature > 0 samples; a tiny top_p keeps only the greedy token."""
    ids = render(engine, QUESTION)
    _, greedy_ids = run(engine, ids, greedy(12))
    narrow = SamplingParams(max_tokens=12, temperature=1.0, top_p=1e-6)
    assert run(engine, ids, narrow)[1] == greedy_ids
    hot = SamplingParams(max_tokens=12, temperature=1.5)
    assert len({tuple(run(engine, ids, hot)[1]) for _ in range(3)}) > 1


def seeded(engine: LlamaCppEngine, ids: Sequence[int], seed: int, n: int) -> list[list[int]]:
    """`n` choices of one seeded request (one rng, as the serving layer makes), each checked
    to reuse nothing."""
    rng = engine.new_rng(seed)
    out = []
    for _ in range(n):
        cached, tokens = run_rng(engine, ids, SamplingParams(max_tokens=16), rng)
        assert cached == 0
        out.append(tokens)
    return out


def run_rng(
    engine: LlamaCppEngine, ids: Sequence[int], params: SamplingParams, rng: Any
) -> tuple[int, list[int]]:
    items = list(engine.generate(ids, params, rng))
    assert isinstance(items[0], Prefilled)
    return items[0].cached_tokens, [t.token_id for t in items if isinstance(t, Token)]


def test_a_seed_repeats_cold_or_warm(engine: LlamaCppEngine) -> None:
    """OAI-SEED-05, OAI-SEED-03, OAI-GGUF-01: the same seed and prompt give the same tokens,
    on a fresh model (cold) and after the cache held this very prompt (warm: a seeded request
    prefills in full); the choices of one request differ, another seed differs."""
    ids = render(engine, LONG_ANSWER)
    cold_engine = load()
    try:
        cold = seeded(cold_engine, ids, 7, 3)
    finally:
        cold_engine.close()
    run(engine, ids, greedy(4))  # the cache now holds the prompt
    warm = seeded(engine, ids, 7, 3)
    assert warm == cold
    assert len({tuple(t) for t in warm}) == 3
    assert seeded(engine, ids, 8, 1)[0] not in warm
    assert engine.new_rng(None) is None
    with pytest.raises(TypeError):
        engine.generate([1, 2], greedy(1), object())


def test_penalties_reduce_repetition(engine: LlamaCppEngine) -> None:
    """OAI-CHAT-22, OAI-CHAT-23, OAI-CHAT-24: penalties act as a repetition penalty."""
    ids = render(engine, LONG_ANSWER)

    def repeats(frequency: float, presence: float) -> int:
        params = greedy(32, frequency_penalty=frequency, presence_penalty=presence)
        out = run(engine, ids, params)[1]
        return len(out) - len(set(out))

    assert repeats(1.0, 1.0) < repeats(0.0, 0.0) < repeats(-1.0, -1.0)


@pytest.mark.parametrize(("frequency", "presence"), [(0.5, 0.0), (0.0, -1.0), (2.0, 1.5)])
def test_penalty_formula_equals_the_transformers_engine(frequency: float, presence: float) -> None:
    """OAI-CHAT-24: the same multiplicative penalty on both engines."""
    import torch

    from miserver.engines.transformers.sampling import apply_penalties

    rng = np.random.default_rng(0)
    logits = rng.normal(size=100).astype(np.float32)
    generated = [5, 7, 7, 9, 9, 9, 42]
    penalties = Penalties(frequency, presence)
    for token_id in generated:
        penalties.add(token_id)
    ours = logits.copy()
    penalties.apply(ours)
    ids, counts = np.unique(generated, return_counts=True)
    theirs = apply_penalties(
        torch.from_numpy(logits),
        torch.from_numpy(ids),
        torch.from_numpy(counts.astype(np.float32)),
        frequency=frequency,
        presence=presence,
    )
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)


def test_stream_text_with_stops(engine: LlamaCppEngine) -> None:
    """OAI-CHAT-20, OAI-CHAT-21: the stream equals the decode, cut at a stop."""
    ids = render(engine, LONG_ANSWER)
    tokens = run(engine, ids, greedy(24))[1]
    full = engine.decode(tokens)
    detok = Detokenizer(engine.decode)
    streamed = "".join(detok.push(token_id) for token_id in tokens) + detok.flush()
    assert streamed == full
    stop = full.split()[5]
    released, matched = StopMatcher([stop]).push(streamed)
    assert matched and released == full[: full.index(stop)]


def test_generation_stays_within_the_window() -> None:
    """OAI-CHAT-18: generation never outgrows n_ctx; a prompt past it is refused."""
    small = load(ctx_size=256)  # llama.cpp rounds n_ctx up to a multiple of 256
    try:
        assert small.facts.context_length == small.context.window == 256
        ids = render(small, [{"role": "user", "content": "Repeat after me: " + "la " * 200}])
        assert 200 < len(ids) < 250
        _, tokens = run(small, ids, greedy(1000))
        assert len(tokens) == 256 - len(ids)
        with pytest.raises(ValueError, match="window"):
            next(small.generate(list(range(100, 357)), greedy(1), None))
    finally:
        small.close()


# KV prefix reuse


def test_resending_with_one_more_message_prefills_only_it(engine: LlamaCppEngine) -> None:
    """LOC-CHAT-43, LOC-CHAT-44, LOC-CHAT-47: the cached count is the prefix really kept."""
    first = render(engine, QUESTION)
    _, answer = run(engine, first, greedy(24))
    held = engine.context.held
    assert held == first + answer[:-1]  # the last token was sampled, never run
    reply = {"role": "assistant", "content": engine.decode(answer)}
    second = render(engine, [*QUESTION, reply, *CAPITAL])
    cached, tokens = run(engine, second, greedy(16))
    assert cached == common_prefix(held, second) > len(first)
    fresh = load()
    try:
        assert run(fresh, second, greedy(16)) == (0, tokens)
    finally:
        fresh.close()


def test_edits_and_other_conversations_prefill_from_the_first_difference(
    engine: LlamaCppEngine,
) -> None:
    """LOC-CHAT-45, LOC-CHAT-46, LOC-CHAT-48: one cache; turns evict each other."""
    a = render(engine, [{"role": "system", "content": "Talk like a pirate."}, *QUESTION])
    b = render(engine, [{"role": "system", "content": "Reply in one word."}, *CAPITAL])
    _, a_tokens = run(engine, a, greedy(12))
    assert run(engine, a, greedy(12)) == (len(a) - 1, a_tokens)  # regenerated: all but one
    cached_b, _ = run(engine, b, greedy(12))
    assert cached_b == common_prefix(a, b) < 5  # a different conversation: almost nothing
    assert run(engine, a, greedy(12)) == (common_prefix(b, a), a_tokens)  # b evicted a
    edited = render(engine, [{"role": "system", "content": "Talk like a parrot."}, *QUESTION])
    cached, _ = run(engine, edited, greedy(4))
    assert cached == common_prefix(a + a_tokens[:-1], edited) < len(a) - 5


def test_closing_early_leaves_a_usable_context(engine: LlamaCppEngine) -> None:
    """OAI-STREAM-07, LOC-CHAT-43: closing stops before the next step; the cache stays."""
    ids = render(engine, LONG_ANSWER)
    _, expected = run(engine, ids, greedy(10))
    stream = engine.generate(ids, greedy(50), None)
    assert isinstance(next(stream), Prefilled)
    first, second = next(stream), next(stream)
    stream.close()
    assert isinstance(first, Token) and isinstance(second, Token)
    assert engine.context.held == [*ids, first.token_id]  # the second token never ran
    assert run(engine, ids, greedy(10)) == (len(ids) - 1, expected)


def test_interleaved_generators_keep_their_own_sequence(engine: LlamaCppEngine) -> None:
    """LOC-CHAT-48: two open generations share the one cache; each step re-holds its own.

    Re-holding runs a sequence in a batch where it first ran token by token, so
    the logits may differ in the last bits: the bookkeeping is checked exactly,
    the tokens only where a near tie cannot have flipped them (the first ones).
    """
    prompts = {1: render(engine, QUESTION), 2: render(engine, CAPITAL)}
    expected = {key: run(engine, ids, greedy(8))[1] for key, ids in prompts.items()}
    streams = {key: engine.generate(ids, greedy(8), None) for key, ids in prompts.items()}
    got: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(9):
        for key, stream in streams.items():
            item = next(stream, None)
            if isinstance(item, Token):
                got[key].append(item.token_id)
                if len(got[key]) > 1:  # the first was picked with the prefill, before Prefilled
                    assert engine.context.held == prompts[key] + got[key][:-1]
    assert all(len(got[key]) == 8 and got[key][:3] == expected[key][:3] for key in got)


def test_close_frees_the_model() -> None:
    """Engines can be unloaded; a closed engine, and a generation left open, refuse work."""
    closing = load()
    ids = render(closing, QUESTION)
    stream = closing.generate(ids, greedy(8), None)
    next(stream)
    closing.close()
    closing.close()
    with pytest.raises(RuntimeError):
        list(stream)  # the token sampled before the close comes out; the next step fails
    with pytest.raises(RuntimeError):
        closing.generate(ids, greedy(1), None)
    with pytest.raises(RuntimeError):
        closing.decode(ids)


# Constrained decoding (llguidance over the GGUF vocabulary)

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
DAYS = {
    "type": "object",
    "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["days"],
    "additionalProperties": False,
}


def constrained(
    engine: LlamaCppEngine, ids: Sequence[int], constraint: Constraint, rng: Any = None
) -> tuple[str, bool]:
    """The text of one constrained generation at temperature 1, and whether it ended."""
    params = SamplingParams(max_tokens=48, temperature=1.0, constraint=constraint)
    tokens = [t for t in engine.generate(ids, params, rng) if isinstance(t, Token)]
    return engine.decode([t.token_id for t in tokens]), tokens[-1].eos


def test_json_schema_samples_end_and_validate(engine: LlamaCppEngine) -> None:
    """OAI-SO-02, OAI-SO-08, OAI-SO-18, OAI-GGUF-01: ten samples at temperature 1 under a
    schema each end with an end-of-generation token and validate; every choice has its own
    grammar state."""
    constraint = Constraint(json.dumps(VERDICT))
    engine.compile_constraint(constraint)
    ids = render(engine, [{"role": "user", "content": "Is the sky blue? Rate it 1 to 5."}])
    validator = Draft202012Validator(VERDICT)
    rng = engine.new_rng(3)
    for _ in range(10):
        text, ended = constrained(engine, ids, constraint, rng)
        assert ended, text
        assert not list(validator.iter_errors(json.loads(text))), text


def test_a_call_constraint_writes_one_option_then_the_tail(engine: LlamaCppEngine) -> None:
    """OAI-TOOLS-14, OAI-TOOLS-15, OAI-GGUF-01: a forced call's continuation on llama.cpp:
    one option's head, arguments valid under that option's schema, then the tail."""
    heads = ['{"name": "get_weather", "arguments": ', '{"name": "forecast", "arguments": ']
    call = {"options": [[heads[0], CITY], [heads[1], DAYS]], "tail": "}"}
    constraint = Constraint(json.dumps(call), "call")
    ids = render(engine, [{"role": "user", "content": "What is the weather in Paris?"}])
    seen = set()
    for seed in range(4):
        text, ended = constrained(engine, ids, constraint, engine.new_rng(seed))
        assert ended and text.endswith("}"), text
        head = next(h for h in heads if text.startswith(h))
        schema = CITY if head == heads[0] else DAYS
        arguments = json.loads(text[len(head) : -1])
        assert not list(Draft202012Validator(schema).iter_errors(arguments)), text
        seen.add(head)
    assert seen


def test_a_grammar_the_library_refuses_is_unsupported(engine: LlamaCppEngine) -> None:
    """OAI-SO-20, OAI-SO-22: a look-ahead the grammar library cannot enforce raises
    ConstraintUnsupported at compile time, before any generation."""
    with pytest.raises(ConstraintUnsupported, match="look"):
        engine.compile_constraint(
            Constraint(json.dumps({"type": "string", "pattern": "^(?=a)a+$"}))
        )


def test_the_mask_matches_the_transformers_engine(engine: LlamaCppEngine, hf_engine: Any) -> None:
    """OAI-TOKIDS-01, OAI-GGUF-01: one model file, one grammar: the first step of `json_object`
    allows the same token ids on both engines (one tokenizer for llguidance each)."""
    constraint = Constraint(json.dumps({"type": "object"}))
    width = engine.facts.vocab_size
    ours = engine.grammars.guide(constraint).allowed(width)
    hf = Grammars(hf_engine.tokenizer, hf_engine.eos_ids, width)
    theirs = hf.guide(constraint).allowed(width)
    assert 0 < int(ours.sum()) < 10 and (ours == theirs).all()
    assert all(engine.token_text(int(i)).startswith("{") for i in np.flatnonzero(ours))


def test_a_gpu_build_is_handed_its_gpu_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48 item 2: on a build of llama-cpp-python with a GPU backend (`gpu_offload`),
    `n_gpu_layers` reaches llama.cpp and the facts say the model runs on the `gpu`; on this
    CPU build, none reaches it. This build is told it has one, so its loader runs the GPU
    build's code; llama.cpp, with no GPU backend to place them on, keeps the layers on the
    CPU and the model answers as before."""
    offload = LoadOptions(threads=1, cache_ram=0, n_gpu_layers=8)
    cpu = load_llamacpp_engine(smollm2_gguf(), model_id="cpu", options=offload)
    try:
        assert cpu.facts.device == "cpu"  # the PyPI wheel: turned off
    finally:
        cpu.close()
    monkeypatch.setattr(llamacpp_loading, "gpu_offload", lambda: True)
    gpu = load_llamacpp_engine(smollm2_gguf(), model_id="gpu", options=offload)
    try:
        assert gpu.facts.device == "gpu"
        never_ends = tuple((i, -100.0) for i in gpu.facts.eog_ids)
        params = SamplingParams(max_tokens=4, temperature=0, logit_bias=never_ends)
        tokens = gpu.generate(gpu.tokenize("Hi"), params, None)
        assert len([t for t in tokens if isinstance(t, Token)]) == 4
    finally:
        gpu.close()
