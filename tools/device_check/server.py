"""Checks 3 and 4, through miserver's app on loopback: per-row steering in concurrent chats
and its headers; SAE activations and a probe's scores against a plain forward. Also the
serving harness the speed check shares."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM

from miserver.app import Server
from miserver.settings import Settings
from miserver.steering import steering_set_hash
from miserver.steering.header import InlineMember, NoneMember, parse
from tools.uvicorn_thread import uvicorn_serving

from .agreement import REL, Greedy, agreement, divergence, relative_error
from .models import D_SAE, LAYER, SAE_ID, SEED, SMOLLM2, chat, free
from .report import Plan, Row, guarded

PROBE = "dc-linear"
TOP_K = 5


def session_device(device: torch.device) -> str:
    """The `device` parameter's value for `device` (cuda for GPU 0, cuda:N past it)."""
    return "cuda" if device.type == "cuda" and not device.index else str(device)


@contextlib.contextmanager
def serving(
    plan: Plan, folder: Path, *, parallel: int, dtype: str, saes: Path | None = None
) -> Iterator[httpx.Client]:
    """`miserver`'s app on loopback serving `folder` on the plan's device, `parallel` rows."""
    data = Path(tempfile.mkdtemp(prefix="data-", dir=plan.work))
    settings = Settings(
        data_dir=data,
        cache_dir=plan.work / "cache",
        models_dir=folder.parent,
        saes_dir=saes,
        model=folder.name,
        threads=plan.threads,
    )
    flags = {
        "parallel": parallel,
        "device": session_device(plan.device),
        "dtype": dtype,
        "cache-ram": 0,
    }
    app = Server(settings, flags=flags)
    with (
        uvicorn_serving(app, start_timeout=600.0) as port,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0) as client,
    ):
        ready(client, folder.name, plan.name)
        yield client
    free(plan)


def ready(client: httpx.Client, model_id: str, device: str) -> None:
    """Wait for the launch model; refuse a load that failed, fell back or is serial."""
    deadline = time.monotonic() + 600.0
    while (state := client.get("/v1/health/ready").json())["status"] != "ready":
        if state["status"] == "error" or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not load {model_id}: {state}")
        time.sleep(0.2)
    health = client.get("/api/health/inference").json()
    if (health["model"], health["device"]) != (model_id, device):
        raise RuntimeError(f"asked for {model_id} on {device}, the server says {health}")
    if health["backend"] != "continuous_batching":
        raise RuntimeError(f"the server decodes {health['backend']}, not in rows")


def chat_body(model_id: str, i: int, n: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model_id,
        "messages": chat(i),
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 2,
        **extra,
    }


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    response = client.post(path, json=body)
    if response.status_code not in (200, 201):
        raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")
    return response


def wire_greedy(response: httpx.Response) -> Greedy:
    """A chat reply's tokens (their texts) and top-2 gaps, from its logprobs."""
    content = response.json()["choices"][0]["logprobs"]["content"]
    gaps = [c["top_logprobs"][0]["logprob"] - c["top_logprobs"][1]["logprob"] for c in content]
    return Greedy(tuple(c["token"] for c in content), tuple(gaps))


def steering_set(i: int) -> dict[int, float]:
    """Row i's own inline set: three features no other row's set shares, in units of the
    residual's norm (the SAE's decoder rows are that long)."""
    return {7 + i: 4.0, 300 + i: -3.0, 1000 + i: 2.5}


def check_steering(plan: Plan, client: httpx.Client, model_id: str) -> list[Row]:
    """3: `plan.rows` concurrent chats, the odd ones each steered its own way."""
    post(client, "/api/steering/attachments", {"sae_id": SAE_ID})
    k, n = plan.rows, plan.tokens
    sets = {i: steering_set(i) for i in range(1, k, 2)}
    alone = [
        wire_greedy(post(client, "/v1/chat/completions", chat_body(model_id, i, n)))
        for i in range(k)
    ]

    def ask(i: int) -> httpx.Response:
        extra: dict[str, Any] = {}
        if i in sets:
            features = [{"index": f, "strength": s} for f, s in sets[i].items()]
            extra["steering"] = {"sae_id": SAE_ID, "features": features}
        return post(client, "/v1/chat/completions", chat_body(model_id, i, n, **extra))

    with ThreadPoolExecutor(max_workers=k) as pool:
        answers = list(pool.map(ask, range(k)))
    plain = [i for i in range(k) if i not in sets]
    same, figure = agreement([(wire_greedy(answers[i]), alone[i]) for i in plain])
    moved = {i: divergence(wire_greedy(answers[i]), alone[i]) for i in sets}
    firsts = [str(d[0]) for d in moved.values() if d is not None]
    wrong = [
        f"#{i}: {answers[i].headers.get('X-miLLM-Steering')!r}"
        for i in range(k)
        if _members(answers[i]) != expected_header(sets.get(i))
    ]
    what = f"{k} concurrent chats x {n} tokens, {len(sets)} steered (3 features each)"
    return [
        Row("3 steering: unsteered rows = alone", what, figure, same),
        Row(
            "3 steering: steered rows differ",
            what,
            f"{len(firsts)}/{len(sets)} differ from their unsteered twin, first at token "
            + ", ".join(firsts),
            len(firsts) == len(sets),
        ),
        Row(
            "3 steering: X-miLLM-Steering",
            "each reply's header: its own inline set (hash) or none",
            f"{k - len(wrong)}/{k} right" + "".join(f"; {w}" for w in wrong),
            not wrong,
        ),
    ]


def _members(response: httpx.Response) -> list[object]:
    try:
        return list(parse(response.headers.get("X-miLLM-Steering", "")))
    except ValueError:
        return []


def expected_header(pairs: dict[int, float] | None) -> list[object]:
    if pairs is None:
        return [NoneMember()]
    hashed = steering_set_hash(SAE_ID, list(pairs.items()))
    return [InlineMember(sae=SAE_ID, layer=LAYER, features=len(pairs), hash=hashed)]


def probe_weight(d_model: int, scale: float) -> torch.Tensor:
    """A linear probe's weight: O(1) values over residuals of norm `scale`."""
    return torch.randn(d_model, generator=torch.Generator().manual_seed(SEED + 2)) / scale


def check_readings(
    plan: Plan, client: httpx.Client, folder: Path, sae: dict[str, torch.Tensor], scale: float
) -> list[Row]:
    """4: one chat reading every position's top SAE features with a linear probe armed,
    against a plain forward of the ids the reply lists."""
    weight, bias = probe_weight(SMOLLM2["hidden_size"], scale), 0.25
    detector = {"kind": "linear", "layer": LAYER, "weight": weight.tolist(), "bias": bias}
    probe = {"detector": detector, "threshold": 0.0, "windows": ["prompt", "completion"]}
    response = client.put(
        f"/api/probes/{PROBE}", json={**probe, "aggregate": "mean", "armed": True}
    )
    if response.status_code not in (200, 201):
        raise RuntimeError(f"PUT /api/probes/{PROBE}: {response.status_code} {response.text}")
    reading = {"sae_id": SAE_ID, "positions": "all", "top_k": TOP_K}
    body = chat_body(folder.name, 0, plan.tokens, return_sae_activations=reading)
    reply = post(client, "/v1/chat/completions", body).json()
    listed = reply["millm"]["sae_activations"]["positions"]
    usage = reply["usage"]
    fed = [p["token_id"] for p in listed]
    if len(fed) != usage["prompt_tokens"] + usage["completion_tokens"] - 1:
        raise RuntimeError(f"{len(fed)} positions read for {usage}")
    hidden = layer_output(plan, folder, fed)
    got = torch.tensor([[f["value"] for f in p["features"]] for p in listed])
    want = torch.topk(encode(sae, hidden), TOP_K, dim=-1).values.cpu()
    values = (hidden.double() @ weight.double().to(hidden.device) + bias).cpu()
    prompt = usage["prompt_tokens"]
    spans = {"prompt": values[:prompt], "completion": values[prompt:]}
    scores = {r["window"]: r["score"] for r in reply["millm_probe_verdicts"] if r["probe"] == PROBE}
    errors = {w: relative_error(torch.tensor(scores[w]), v.mean()) for w, v in spans.items()}
    act = relative_error(got, want)
    return [
        Row(
            "4 activations = forward",
            f"top {TOP_K} of {D_SAE} at all {len(fed)} positions, layer {LAYER}",
            f"max rel. error {act:.1e} (tolerance {REL:g})",
            act <= REL,
        ),
        Row(
            "4 probe score = forward",
            "linear probe, mean over the prompt and the completion",
            ", ".join(f"{w} {scores[w]:.4f} (rel. error {e:.1e})" for w, e in errors.items()),
            max(errors.values()) <= REL,
        ),
    ]


def layer_output(plan: Plan, folder: Path, ids: list[int]) -> torch.Tensor:
    """Decoder layer LAYER's output over `ids`: a plain float32 forward, no cache, of the
    folder's weights loaded afresh on the plan's device ([positions, width])."""
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = loaded.to(plan.device)  # type: ignore[arg-type]
    with torch.inference_mode():
        inputs = torch.tensor([ids], device=plan.device)
        states = model(inputs, output_hidden_states=True, use_cache=False).hidden_states
    hidden: torch.Tensor = states[LAYER + 1][0].float()
    del model, states
    free(plan)
    return hidden


def encode(sae: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A standard SAE's features: relu((x - b_dec) @ W_enc + b_enc)."""
    w = {name: tensor.to(x.device) for name, tensor in sae.items()}
    return torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])


def check_server(plan: Plan, folder: Path, sae: dict[str, torch.Tensor], scale: float) -> list[Row]:
    """3 and 4 on one server: the model served with `plan.rows` rows, the SAE in its dir."""
    with serving(
        plan, folder, parallel=plan.rows, dtype="float32", saes=plan.work / "saes"
    ) as client:
        rows = guarded("3 steering", lambda: check_steering(plan, client, folder.name))
        rows += guarded("4 readings", lambda: check_readings(plan, client, folder, sae, scale))
    return rows
