"""Float32 scoring (OAI-F32) on a bfloat16 SmolLM2 and on the float32 one.

A bfloat16 copy of SmolLM2 (`bf16_models_dir`) is the served model: a
`scoring_precision: "float32"` request scores on a float32 copy built for the
request and released after; the served weights stay bfloat16. The reference
is an independent float32 computation: the same checkpoint loaded in
float32 (bfloat16 widens to float32 exactly).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient
from transformers import AutoModelForCausalLM

from miserver.app import Server
from miserver.engines.transformers import float32
from miserver.settings import Settings
from tests.conftest import BF16_MODEL_ID, ENGINE_THREADS, MODEL_ID, LocalClient, cache_dir
from tests.errors import error_of

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"


def serve(tmp: Path, models: Path, **knobs: Any) -> TestClient:
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp / "data",
        cache_dir=cache_dir(),
        models_dir=models,
        model=BF16_MODEL_ID,
        **knobs,
    )
    # served in bfloat16: `dtype` auto would load float32 on the CPU (issue 48)
    server = Server(settings, flags={"dtype": "bfloat16"})
    return LocalClient(server, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory, bf16_models_dir: Path) -> Iterator[TestClient]:
    with serve(tmp_path_factory.mktemp("f32"), bf16_models_dir) as client:
        yield client


def score(client: TestClient, model: str = BF16_MODEL_ID, **extra: Any) -> Any:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "logprobs": 5, **extra}
    return client.post("/v1/completions", json=body)


def top(response: Any) -> dict[str, float]:
    assert response.status_code == 200, response.text
    found: dict[str, float] = response.json()["choices"][0]["logprobs"]["top_logprobs"][0]
    return found


def reference(models: Path, client: TestClient) -> dict[str, float]:
    """log_softmax of an independent float32 forward of the same ids."""
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    ids = engine.tokenize(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(models / BF16_MODEL_ID, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    logprobs = torch.log_softmax(logits, -1)
    best = torch.topk(logprobs, 5)
    return {
        engine.token_text(int(i)): float(v) for i, v in zip(best.indices, best.values, strict=True)
    }


def test_float32_scoring_agrees_with_an_independent_float32_forward(
    bf16: TestClient, bf16_models_dir: Path
) -> None:
    """OAI-F32-01/02/26, issue #5 acceptance (float32 path within 1e-5); F32-10: the echo;
    F32-03: the served weights stay bfloat16."""
    engine = bf16.app.state.manager.resident.engine  # type: ignore[attr-defined]
    served = next(engine.model.parameters())
    before = served.detach().clone()
    response = score(bf16, scoring_precision="float32")
    assert response.json()["scoring_precision"] == "float32"
    assert response.headers["X-miLLM-Scoring-Precision"] == "float32"
    got, expected = top(response), reference(bf16_models_dir, bf16)
    assert list(got) == list(expected)
    assert all(abs(got[k] - expected[k]) < 1e-5 for k in expected)
    native = top(score(bf16))
    assert max(abs(native[k] - expected[k]) for k in expected if k in native) > 1e-4
    assert served.dtype == torch.bfloat16 and torch.equal(served, before)


def test_the_echo_appears_only_when_sent(bf16: TestClient) -> None:
    """OAI-F32-11, OAI-F32-12, OAI-F32-23."""
    native = score(bf16, scoring_precision="native")
    assert native.json()["scoring_precision"] == "native"
    assert native.headers["X-miLLM-Scoring-Precision"] == "native"
    absent = score(bf16)
    assert "scoring_precision" not in absent.json()
    assert "X-miLLM-Scoring-Precision" not in absent.headers
    chat = {"model": BF16_MODEL_ID, "messages": [{"role": "user", "content": "Hi"}]}
    assert (
        bf16.post(
            "/v1/chat/completions", json={**chat, "max_tokens": 2, "scoring_precision": "native"}
        ).status_code
        == 200
    )


def test_float32_outside_scoring_mode_and_on_chat_is_refused(bf16: TestClient) -> None:
    """OAI-F32-19, OAI-F32-20, OAI-VALID-30."""
    body = {"model": BF16_MODEL_ID, "prompt": PROMPT, "max_tokens": 2}
    error_of(
        bf16.post("/v1/completions", json={**body, "scoring_precision": "float32"}),
        400,
        "invalid_parameter",
        "scoring_precision",
    )
    chat = {"model": BF16_MODEL_ID, "messages": [{"role": "user", "content": "Hi"}]}
    chat |= {"max_tokens": 1, "logprobs": True, "scoring_precision": "float32"}
    error_of(
        bf16.post("/v1/chat/completions", json=chat), 400, "field_not_honoured", "scoring_precision"
    )


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"scoring_float32_headroom_mb": 10**9}, "memory"),
        ({"scoring_float32_device": "cuda"}, "device"),
    ],
    ids=["OAI-F32-16", "OAI-F32-17"],
)
def test_unservable_float32_is_409_with_its_reason(
    tmp_path: Path, bf16_models_dir: Path, knobs: dict[str, Any], reason: str
) -> None:
    """OAI-F32-13, OAI-F32-14: 409 scoring_precision_unavailable, the reason in message and
    header; never answered in another precision."""
    with serve(tmp_path, bf16_models_dir, **knobs) as client:
        response = score(client, scoring_precision="float32")
        error = error_of(response, 409, "scoring_precision_unavailable", "scoring_precision")
        assert reason in error["message"]
        assert response.headers["X-miLLM-Scoring-Precision-Reason"] == reason


def test_a_float32_model_is_scored_as_it_is(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-F32-07: SmolLM2 served in float32 is scored as it is, with no copy."""
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    assert next(engine.model.parameters()).dtype == torch.float32

    def no_copy(_: object) -> None:
        raise AssertionError("a float32 model must not be copied")

    monkeypatch.setattr(float32, "copy", SimpleNamespace(deepcopy=no_copy))
    response = score(client, MODEL_ID, scoring_precision="float32")
    assert response.status_code == 200
    assert top(response) == top(score(client, MODEL_ID))


def test_chat_scoring_without_a_chat_template_is_refused(
    tmp_path: Path, bf16_models_dir: Path
) -> None:
    """OAI-CSCORE-12, OAI-TOKIDS-08: chat scoring needs the model's own template (generation
    falls back to a generic one, OAI-TOKIDS-07; scoring does not)."""
    models = tmp_path / "models"
    bare = models / "NoTemplate"
    bare.mkdir(parents=True)
    for item in (bf16_models_dir / BF16_MODEL_ID).iterdir():
        if item.name != "chat_template.jinja":
            (bare / item.name).symlink_to(item)
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        models_dir=models,
        model="NoTemplate",
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        chat = {"model": "NoTemplate", "messages": [{"role": "user", "content": "Hi"}]}
        scored = client.post(
            "/v1/chat/completions", json={**chat, "max_tokens": 1, "logprobs": True}
        )
        error_of(scored, 400, "no_chat_template", "messages")
        generated = client.post("/v1/chat/completions", json={**chat, "max_tokens": 2})
        assert generated.status_code == 200
