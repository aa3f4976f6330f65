"""Reading layers on the llama.cpp engine (issue 46): captures (OAI-ACT) and probe monitors
through the context's evaluation callback (engines/llamacpp/tap.py), against the
transformers engine reading the same layer of the same model.

The GGUF computes from Q4_1 blocks, the transformers engine from their float32
dequantization: a layer's rows differ by a few percent of their norm (measured on this
prompt: at most 1.8% at layer 0, 3.3% at layer 12, 6.7% at the last layer, cosine above
0.997), the documented tolerance (docs/DECISIONS.md, contract 0.26.0) `REL`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from miserver.engines.base import (
    Capture,
    ChatPrompt,
    Engine,
    Hooks,
    Joiner,
    LoadOptions,
    SamplingParams,
    ScoreQuery,
    Token,
)
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from miserver.engines.monitor import Detector, Monitor
from miserver.engines.transformers import TransformersEngine
from miserver.steering.applied import applied_sae, snapshot
from miserver.steering.sae import SAE
from miserver.steering.source import FixedSource
from tests.conftest import ENGINE_THREADS
from tests.engines import smollm2_gguf
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

CHAT = ChatPrompt(({"role": "user", "content": "Tell me about your favourite place."},))
OTHER = ChatPrompt(({"role": "user", "content": "What is the capital of France?"},))
TOKENS = 6
REL = 0.08  # the largest row's relative difference from the transformers engine's
LAYER = 12


@pytest.fixture(scope="module")
def gguf(engine_pair: tuple[LlamaCppEngine, TransformersEngine]) -> LlamaCppEngine:
    return engine_pair[0]


@pytest.fixture(scope="module")
def hf(engine_pair: tuple[LlamaCppEngine, TransformersEngine]) -> TransformersEngine:
    return engine_pair[1]


def greedy(engine: Engine, chat: ChatPrompt, hooks: Hooks) -> list[int]:
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    ids = engine.render_chat(chat)
    return [t.token_id for t in engine.generate(ids, params, None, hooks) if isinstance(t, Token)]


def captured(engine: Engine, layer: int, *, pre: bool = False, steering: object = None) -> Any:
    capture = Capture(layer, pre_steering=pre)
    greedy(engine, CHAT, Hooks(steering=steering, capture=capture))  # type: ignore[arg-type]
    return capture.rows


def norms() -> Monitor:
    """A monitor whose one detector at LAYER gives each position's row norm."""
    return Monitor([Detector(layer=LAYER, values=lambda r: torch.linalg.vector_norm(r, dim=1))])


def steered(sae: SAE, strength: float) -> FixedSource:
    return FixedSource(snapshot([applied_sae("inline", sae, sae.layer, {5: strength})]))


@pytest.mark.parametrize("layer", [0, LAYER, 29], ids=["first", "sae-layer", "last"])
def test_a_capture_equals_the_transformers_engines(
    gguf: LlamaCppEngine, hf: TransformersEngine, layer: int
) -> None:
    """Issue 46, OAI-ACT-05: a capture on GGUF holds a row per position fed (the prompt, then
    each generated token but the last), as on transformers, each within `REL` of the
    transformers engine's row; the last layer too (llama.cpp keeps its rows only where
    logits are kept: a reading of it keeps them all)."""
    ours, theirs = captured(gguf, layer), captured(hf, layer)
    prompt = len(gguf.render_chat(CHAT))
    assert ours.shape == theirs.shape == (prompt + TOKENS - 1, gguf.facts.d_model)
    relative = torch.linalg.vector_norm(ours - theirs, dim=1) / torch.linalg.vector_norm(
        theirs, dim=1
    )
    assert float(relative.max()) < REL


def test_pre_steering_rows_are_the_layers_own(gguf: LlamaCppEngine, trained_sae: SAE) -> None:
    """OAI-ACT-10 on GGUF: under steering at the read layer, the post-steering rows are the
    pre-steering ones plus the vector; the pre-steering rows of the prompt equal an unsteered
    run's (the steering adds at this layer's output, so nothing before it moved)."""
    vector = steered(trained_sae, 80.0).vector(LAYER)
    post = captured(gguf, LAYER, steering=steered(trained_sae, 80.0))
    pre = captured(gguf, LAYER, pre=True, steering=steered(trained_sae, 80.0))
    assert torch.allclose(post - pre, vector.expand_as(post), atol=2e-3)
    plain = captured(gguf, LAYER)
    prompt = len(gguf.render_chat(CHAT))
    assert torch.allclose(pre[:prompt], plain[:prompt], atol=1e-4)
    assert not torch.allclose(post[:prompt], plain[:prompt], atol=1.0)


def test_scoring_reads_the_prompt(gguf: LlamaCppEngine) -> None:
    """A scoring pass with a capture (activations on a scoring request) reads one row per
    prompt position, the rows a generation's prefill reads."""
    capture = Capture(LAYER, pre_steering=False)
    ids = gguf.render_chat(CHAT)
    gguf.score(ids, ScoreQuery(), capture)
    assert torch.allclose(capture.rows, captured(gguf, LAYER)[: len(ids)], atol=1e-3)


def test_a_monitored_row_reads_what_it_reads_alone(gguf: LlamaCppEngine, trained_sae: SAE) -> None:
    """Probes on a row of the batch (issue 46): a monitored row beside an unmonitored one and
    a steered one gets the values it gets alone on the serial path, one per position fed,
    read before the steering delta; its tokens are its own."""
    alone = norms()
    alone_ids = greedy(gguf, CHAT, Hooks(steering=steered(trained_sae, 80.0), monitor=alone))
    batch = gguf.batch
    assert batch is not None
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    row_monitor = norms()
    joiners = [
        Joiner(gguf.render_chat(OTHER), params, None),
        Joiner(
            gguf.render_chat(CHAT),
            params,
            None,
            Hooks(steering=steered(trained_sae, 80.0), monitor=row_monitor),
        ),
        Joiner(gguf.render_chat(OTHER), params, None, Hooks(steering=steered(trained_sae, -80.0))),
    ]
    rows = batch.join_all(joiners)
    assert not any(isinstance(r, Exception) for r in rows)
    tokens = stepped(batch, rows)  # type: ignore[arg-type]
    assert [t.token_id for t in tokens[1]] == alone_ids
    expected, got = alone.values(0), row_monitor.values(0)
    assert len(got) == len(expected) == len(gguf.render_chat(CHAT)) + TOKENS - 1
    assert got == pytest.approx(expected, rel=1e-3)
    plain = norms()
    greedy(gguf, CHAT, Hooks(monitor=plain))
    prompt = len(gguf.render_chat(CHAT))
    assert got[:prompt] == pytest.approx(plain.values(0)[:prompt], rel=1e-4)  # pre-steering


def test_a_row_captures_nothing(gguf: LlamaCppEngine) -> None:
    """A reading runs on the serial path (OAI-ACT-25): a row with a capture is refused."""
    batch = gguf.batch
    assert batch is not None
    joiner = Joiner(
        gguf.render_chat(CHAT),
        SamplingParams(max_tokens=2, temperature=0.0),
        None,
        Hooks(capture=Capture(LAYER, pre_steering=False)),
    )
    [refused] = batch.join_all([joiner])
    assert isinstance(refused, ValueError)


def test_user_span_equals_the_transformers_engines(
    gguf: LlamaCppEngine, hf: TransformersEngine
) -> None:
    """OAI-TOOLS-31 on GGUF: a probe's `last_user` window is the positions the transformers
    engine finds (the two render the same ids): past an earlier turn saying the same words,
    with content parts, with tools shown; none without user text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say: the cat sat."},
        {"role": "assistant", "content": "the cat sat."},
        {"role": "user", "content": [{"type": "text", "text": "the cat sat."}]},
    ]
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    prompts = [
        ChatPrompt(messages=messages),
        ChatPrompt(messages=messages[:2]),
        ChatPrompt(messages=messages, tools=[tool]),
        ChatPrompt(messages=[messages[0]]),
    ]
    for prompt in prompts:
        assert gguf.render_chat(prompt) == hf.render_chat(prompt)
        assert gguf.user_span(prompt) == hf.user_span(prompt)
    span = gguf.user_span(prompts[0])
    assert span is not None
    assert gguf.decode(gguf.render_chat(prompts[0])[span[0] : span[1]]) == "the cat sat."
    assert gguf.user_span(prompts[3]) is None


def test_the_serial_context_takes_its_tap_when_a_generation_first_reads() -> None:
    """Issue 46 (tap.py): until a generation reads a layer, the serial context runs no
    evaluation callback; the first reading makes it anew with one, and a plain generation
    then gives the tokens it gave before."""
    options = LoadOptions(threads=ENGINE_THREADS, ctx_size=512)
    engine = load_llamacpp_engine(smollm2_gguf(), model_id="tap:Q4_1", options=options)
    try:
        plain = greedy(engine, CHAT, Hooks())
        assert not engine.context.tapped
        capture = Capture(LAYER, pre_steering=False)
        assert greedy(engine, CHAT, Hooks(capture=capture)) == plain
        assert engine.context.tapped and capture.rows.shape[0] > 0
        assert greedy(engine, CHAT, Hooks()) == plain
    finally:
        engine.close()


def test_the_batch_takes_its_tap_when_a_monitored_row_first_joins() -> None:
    """Issue 43 (batch.py `Rows._take_tap`): the batch's context runs no evaluation callback
    until a monitored row joins. Then it is made anew with the tap while another row decodes:
    that row's KV goes over, so its tokens are those it makes alone, and its sequence's
    prefix is kept for the next request; the monitored row reads what it reads alone."""
    options = LoadOptions(threads=ENGINE_THREADS, ctx_size=1024, parallel=2)
    engine = load_llamacpp_engine(smollm2_gguf(), model_id="rows-tap:Q4_1", options=options)
    try:
        batch = engine.batch
        assert batch is not None
        params = SamplingParams(max_tokens=2 * TOKENS, temperature=0.0)
        chat = engine.render_chat(CHAT)
        [first] = batch.join_all([Joiner(chat, params, None)])
        [alone_ids] = stepped(batch, [first])  # type: ignore[list-item]
        assert not batch.tapped

        [row] = batch.join_all([Joiner(chat, params, None)])
        assert not isinstance(row, Exception)
        made = [row.last]
        for _ in range(TOKENS - 1):  # halfway through when the monitored row joins
            batch.step([row])
            made.append(row.last)
        monitor = norms()
        hooks = Hooks(monitor=monitor)
        short = SamplingParams(max_tokens=TOKENS, temperature=0.0)
        [watched] = batch.join_all([Joiner(engine.render_chat(OTHER), short, None, hooks)])
        assert not isinstance(watched, Exception)
        assert batch.tapped
        rest, watched_ids = stepped(batch, [row, watched])
        made += rest[1 : row.budget - len(made) + 1]
        assert [t.token_id for t in made] == [t.token_id for t in alone_ids]

        alone = norms()
        assert [t.token_id for t in watched_ids] == greedy(engine, OTHER, Hooks(monitor=alone))
        assert monitor.values(0) == pytest.approx(alone.values(0), rel=1e-3)

        [again] = batch.join_all([Joiner(chat, params, None)])
        assert not isinstance(again, Exception)
        assert again.cached == len(chat) - 1  # the prefix went over with the sequence
        [again_ids] = stepped(batch, [again])
        assert [t.token_id for t in again_ids] == [t.token_id for t in alone_ids]
    finally:
        engine.close()
