"""Check 5, speed: decode tok/s through the server over bare transformers `generate`, at
1 row and as the C-row gain, on the same device and fresh prompts each round.

The server path asks `/v1/completions` with `ignore_eos` at temperature 0: a greedy row
that only bans ids, which the engine picks by an argmax on the device."""

from __future__ import annotations

import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .models import FIRST_WORD, LLAMA_1B, PAD, SPEED_ID, WORDS, build, free
from .report import Plan, Row
from .server import post, serving

log = logging.getLogger("device_check")

GOALS = (0.95, 0.85)  # server ÷ bare at 1 row; its C-row gain ÷ bare's (on a GPU)


def speed_prompts(round_: int, count: int) -> list[list[int]]:
    """`count` prompts of 12..19 word ids, none seen in another round."""
    return [
        [FIRST_WORD + (round_ * 131 + i * 17 + j * 7919) % WORDS for j in range(12 + i % 8)]
        for i in range(count)
    ]


def bare_rate(model: PreTrainedModel, prompts: list[list[int]], n: int) -> float:
    """Tokens a second of `generate` over the prompts left-padded into one batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    _sync(model.device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=PAD,
        )
    _sync(model.device)
    return float((out.shape[1] - width) * len(prompts) / (time.perf_counter() - started))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def server_rate(
    client: httpx.Client, pool: ThreadPoolExecutor, model_id: str, prompts: list[list[int]], n: int
) -> float:
    """Tokens a second of one concurrent client per prompt, each a greedy text completion."""

    def ask(prompt: list[int]) -> int:
        body = {"model": model_id, "prompt": prompt, "max_tokens": n, "temperature": 0}
        found = post(client, "/v1/completions", {**body, "ignore_eos": True}).json()
        return int(found["usage"]["completion_tokens"])

    started = time.perf_counter()
    made = sum(pool.map(ask, prompts))
    return made / (time.perf_counter() - started)


def medians(plan: Plan, folder: Path, dtype: torch.dtype) -> dict[str, float]:
    """The median rate of each way (bare and server, 1 and C rows) over the rounds after a
    warm-up, the folder's model loaded for `generate` beside the server."""
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = loaded.to(plan.device).eval()  # type: ignore[arg-type]
    c, n = plan.speed_rows, plan.tokens
    rates: dict[str, list[float]] = {"bare 1": [], "bare C": [], "server 1": [], "server C": []}
    dtype_name = str(dtype).removeprefix("torch.")
    with (
        serving(plan, folder, parallel=c, dtype=dtype_name) as client,
        ThreadPoolExecutor(max_workers=c) as pool,
    ):
        for round_ in range(plan.rounds + 1):  # round 0 warms up
            prompts = speed_prompts(round_, c)
            found = {
                "bare 1": bare_rate(model, prompts[:1], n),
                "bare C": bare_rate(model, prompts, n),
                "server 1": server_rate(client, pool, folder.name, prompts[:1], n),
                "server C": server_rate(client, pool, folder.name, prompts, n),
            }
            log.info("speed round %d: %s", round_, {k: round(v, 1) for k, v in found.items()})
            for name, rate in found.items():
                if round_:
                    rates[name].append(rate)
    del model
    free(plan)
    return {name: statistics.median(found) for name, found in rates.items()}


def check_speed(plan: Plan, small: Path) -> list[Row]:
    """5: server ÷ bare `generate` at 1 row and the C-row gains' ratio, on the same device."""
    dtype = torch.bfloat16 if plan.gpu else torch.float32
    folder = small
    if plan.gpu:
        folder = plan.work / "speed" / SPEED_ID
        build(folder, LLAMA_1B, dtype=dtype, device=plan.device, init=0.02)
        free(plan)
    med = medians(plan, folder, dtype)
    c, one = plan.speed_rows, med["server 1"] / med["bare 1"]
    gains = (med["server C"] / med["server 1"], med["bare C"] / med["bare 1"])
    dtype_name = str(dtype).removeprefix("torch.")
    what = f"{folder.name} {dtype_name}, {plan.tokens} tokens, median of {plan.rounds}"
    return [
        Row(
            "5 decode tok/s, 1 row: server ÷ bare",
            what,
            f"{med['server 1']:.1f} ÷ {med['bare 1']:.1f} = {one:.3f}",
            None,
            _goal(one, GOALS[0], plan),
        ),
        Row(
            f"5 {c}-row gain: server ÷ bare",
            what + f", {c} clients / a batch of {c}",
            f"{gains[0]:.2f}x ÷ {gains[1]:.2f}x = {gains[0] / gains[1]:.3f}",
            None,
            _goal(gains[0] / gains[1], GOALS[1], plan),
        ),
    ]


def _goal(value: float, goal: float, plan: Plan) -> str:
    if not plan.gpu:
        return f"figure (goal >= {goal} on a GPU)"
    return f"goal >= {goal}: " + ("met" if value >= goal else "not met")
