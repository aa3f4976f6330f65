"""Checks 1 and 2, on the engine itself: greedy ids on the device equal the CPU's and
transformers' `generate`; rows of a batch give what each gives alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from miserver.engines.base import Batch, BatchRow, ChatPrompt, Joiner, SamplingParams, Token
from miserver.engines.transformers import TransformersEngine

from .agreement import Greedy, agreement, of_tokens
from .models import PAD, chat, free, load
from .report import Plan, Row


def greedy_params(engine: TransformersEngine, n: int) -> SamplingParams:
    """`n` greedy tokens, every end-of-generation id banned (as `ignore_eos`), two logprobs."""
    ban = tuple((i, -100.0) for i in engine.facts.eog_ids)
    return SamplingParams(max_tokens=n, temperature=0.0, logit_bias=ban, logprobs=2)


def engine_greedy(engine: TransformersEngine, ids: list[int], n: int) -> Greedy:
    made = engine.generate(ids, greedy_params(engine, n), None)
    return of_tokens([t for t in made if isinstance(t, Token)])


def generate_greedy(model: PreTrainedModel, ids: list[int], n: int) -> Greedy:
    """transformers' own greedy `generate` of `n` tokens (EOS held off by min_new_tokens)."""
    inputs = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            inputs,
            attention_mask=torch.ones_like(inputs),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=PAD,
            output_scores=True,
            return_dict_in_generate=True,
        )
    gaps = [torch.topk(s[0].float(), 2).values for s in out.scores]
    made = out.sequences[0, len(ids) :].tolist()
    return Greedy(tuple(made), tuple(float(t[0] - t[1]) for t in gaps))


def stepped(batch: Batch, rows: Sequence[BatchRow]) -> list[list[Token]]:
    """Step `rows` until each ends (an EOS or its budget) and leaves; each row's tokens (a
    row not `ready` yet, still prefilling in chunks, has none until a step makes it so).
    The engine tests step their batches with it too (tests/engines.py)."""
    out: list[list[Token]] = [[] for _ in rows]
    live = list(range(len(rows)))
    while live:
        for i in list(live):
            row = rows[i]
            if not row.ready:
                continue
            out[i].append(row.last)
            if row.last.eos or len(out[i]) == row.budget:
                batch.leave(row)
                live.remove(i)
        if live:
            batch.step([rows[i] for i in live])
    return out


def check_greedy(plan: Plan, folder: Path) -> list[Row]:
    """1: greedy ids of three prompts on the device = on the CPU; = `generate` there."""
    cpu = load(plan, folder, torch.device("cpu"))
    prompts = [cpu.render_chat(ChatPrompt(chat(i))) for i in range(3)]
    on_cpu = [engine_greedy(cpu, p, plan.tokens) for p in prompts]
    cpu.close()
    free(plan)
    engine = load(plan, folder, plan.device)
    try:
        on_device = [engine_greedy(engine, p, plan.tokens) for p in prompts]
        bare = [generate_greedy(engine.model, p, plan.tokens) for p in prompts]
    finally:
        engine.close()
        free(plan)
    what = f"3 prompts x {plan.tokens} tokens, serial path, float32"
    same, figure = agreement(list(zip(on_device, on_cpu, strict=True)))
    also, versus = agreement(list(zip(on_device, bare, strict=True)))
    return [
        Row(f"1 greedy: {plan.name} = cpu", what, figure, same),
        Row(f"1 greedy: engine = generate on {plan.name}", what, versus, also),
    ]


def check_batch(plan: Plan, folder: Path) -> list[Row]:
    """2: each row of a batch of `plan.rows` prompts gives the ids it gives alone."""
    engine = load(plan, folder, plan.device, parallel=plan.rows)
    try:
        batch = engine.batch
        if batch is None:
            raise RuntimeError(f"loaded with parallel {plan.rows}, the engine has no batch")
        prompts = [engine.render_chat(ChatPrompt(chat(i))) for i in range(plan.rows)]
        alone = [engine_greedy(engine, p, plan.tokens) for p in prompts]
        params = greedy_params(engine, plan.tokens)
        joined = batch.join_all([Joiner(p, params, None) for p in prompts])
        for found in joined:
            if isinstance(found, Exception):
                raise found
        rows = [r for r in joined if not isinstance(r, Exception)]
        together = [of_tokens(tokens) for tokens in stepped(batch, rows)]
    finally:
        engine.close()
        free(plan)
    passed, figure = agreement(list(zip(together, alone, strict=True)))
    what = f"{plan.rows} rows x {plan.tokens} tokens (prompts of 6..{3 * plan.rows + 3} words)"
    return [Row(f"2 batch rows = alone on {plan.name}", what, figure, passed)]
