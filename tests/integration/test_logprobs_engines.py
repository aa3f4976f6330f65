"""Token log-probabilities and the logit bias of rows decoded together (issue 42), on both
engines driven directly: a row of a continuous batch reports what the same request reports
generated alone on the serial path (`engine.generate`), whatever the rows beside it ask.

Each engine is loaded once for the module with three rows, on one thread. "Alone" is the
serial path, as a request that finds no batch would run: llama.cpp within 1e-3 (a batch's
forward passes and the serial context's differ in the last bits of the logits,
tests/integration/test_llamacpp_batch.py), transformers within 1e-4 (its rows are
left-padded); the greedy ids equal.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from miserver.engines.base import (
    BatchRow,
    ChatPrompt,
    Engine,
    Joiner,
    LoadOptions,
    Logprobs,
    SamplingParams,
    Token,
)
from miserver.engines.llamacpp import LlamaCppEngine, load_llamacpp_engine
from miserver.engines.transformers import TransformersEngine, load_transformers_engine
from tests.conftest import ENGINE_THREADS, cache_dir
from tests.engines import smollm2_gguf
from tools.device_check.engine import stepped

pytestmark = pytest.mark.model

ROWS = 3
OPTIONS = LoadOptions(threads=ENGINE_THREADS, ctx_size=512, parallel=ROWS)
TOLERANCE = {"gguf": 1e-3, "transformers": 1e-4}
ASKS = [
    "Name three colours.",
    "What is the capital of France? Answer in one short sentence.",
    "Write a haiku about the sea.",
]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def llamacpp() -> Iterator[LlamaCppEngine]:
    loaded = load_llamacpp_engine(smollm2_gguf(), model_id="rows:Q4_1", options=OPTIONS)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def transformers() -> Iterator[TransformersEngine]:
    loaded = load_transformers_engine(
        smollm2_gguf(), model_id="rows", cache_dir=cache_dir(), options=OPTIONS
    )
    yield loaded
    loaded.close()


@dataclass(frozen=True)
class Loaded:
    name: str
    engine: Engine
    tol: float

    def prompt(self, text: str) -> list[int]:
        chat = ChatPrompt([{"role": "user", "content": text}])
        return [int(i) for i in self.engine.render_chat(chat)]


@pytest.fixture(params=["gguf", "transformers"])
def loaded(request: pytest.FixtureRequest) -> Loaded:
    name = "llamacpp" if request.param == "gguf" else "transformers"
    return Loaded(request.param, request.getfixturevalue(name), TOLERANCE[request.param])


def alone(engine: Engine, ids: list[int], params: SamplingParams) -> list[Token]:
    """The tokens of one generation on the serial path."""
    return [t for t in engine.generate(ids, params, None) if isinstance(t, Token)]


def together(engine: Engine, asks: Sequence[tuple[list[int], SamplingParams]]) -> list[list[Token]]:
    """The asks joined in one `join_all`, stepped together until each row ends (an EOS or
    its budget) and leaves: each row's tokens."""
    batch = engine.batch
    assert batch is not None
    joined = batch.join_all([Joiner(ids, params, None) for ids, params in asks])
    rows: list[BatchRow] = []
    for row in joined:
        assert not isinstance(row, Exception), row
        rows.append(row)
    return stepped(batch, rows)


def same_logprobs(got: Logprobs | None, expected: Logprobs | None, tol: float) -> None:
    assert (got is None) == (expected is None)
    if got is None or expected is None:
        return
    assert got.logprob == pytest.approx(expected.logprob, abs=tol)
    assert len(got.top) == len(expected.top)
    for (got_id, got_value), (id_, value) in zip(got.top, expected.top, strict=True):
        assert got_value == pytest.approx(value, abs=tol)
        if abs(got_value - value) < tol and got_id != id_:  # a near tie may swap two ids
            assert dict(expected.top).get(got_id) == pytest.approx(got_value, abs=tol)
        else:
            assert got_id == id_


def test_rows_report_what_each_reports_alone(loaded: Loaded) -> None:
    """issue 42 (5), OAI-CBM-02: three rows decoded together, each with its own logprobs and
    logit bias, give the ids and the log-probabilities each gives generated alone: two rows
    of one prompt, the first reporting its 4 best, the second 1 best with its greedy first
    token banned (which it never picks, while the first does) and a small bias; a third
    reporting none, with a bias of its own."""
    engine = loaded.engine
    question, other = loaded.prompt(ASKS[1]), loaded.prompt(ASKS[0])
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    banned = alone(engine, question, greedy)[0].token_id
    nudged = engine.tokenize(" Paris", add_special_tokens=False)[0]
    asks = [
        (question, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=4)),
        (
            question,
            SamplingParams(
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                logprobs=1,
                logit_bias=((banned, -100.0), (nudged, 2.0)),
            ),
        ),
        (
            other,
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=((nudged, -3.0),)),
        ),
    ]
    rows = together(engine, asks)
    for (ids, params), row in zip(asks, rows, strict=True):
        solo = alone(engine, ids, params)
        assert [t.token_id for t in row] == [t.token_id for t in solo]
        for got, expected in zip(row, solo, strict=True):
            same_logprobs(got.logprobs, expected.logprobs, loaded.tol)
            if params.logprobs is not None:
                assert got.logprobs is not None and len(got.logprobs.top) == params.logprobs
                assert got.logprobs.top[0][0] == got.token_id  # temperature 0: the best
    free, biased, third = rows
    assert free[0].token_id == banned  # the ban is the second row's alone
    assert banned not in [t.token_id for t in biased]
    assert all(t.logprobs is not None and banned not in dict(t.logprobs.top) for t in biased)
    assert all(t.logprobs is None for t in third)  # asked for none


def test_a_row_asking_for_prompt_logprobs_is_refused(loaded: Loaded) -> None:
    """issue 42 (5): a row keeps no prompt logits, so a joiner with `prompt_logprobs` (echo)
    is refused (ValueError, the serial path serves it), alone or beside a row that joins;
    the batch serves on."""
    engine = loaded.engine
    batch = engine.batch
    assert batch is not None
    ids = loaded.prompt(ASKS[0])
    echo = SamplingParams(max_tokens=2, temperature=0.0, logprobs=1, prompt_logprobs=1)
    with pytest.raises(ValueError, match="prompt logprobs"):
        batch.join(Joiner(ids, echo, None))
    plain = SamplingParams(max_tokens=2, temperature=0.0, logprobs=1)
    refused, row = batch.join_all([Joiner(ids, echo, None), Joiner(ids, plain, None)])
    assert isinstance(refused, ValueError)
    assert not isinstance(row, Exception)
    batch.leave(row)
    assert [t.token_id for t in together(engine, [(ids, plain)])[0]] == [
        t.token_id for t in alone(engine, ids, plain)
    ]
