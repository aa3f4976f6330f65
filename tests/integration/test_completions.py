"""Text completions on the real SmolLM2, in process."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from tests.conftest import MODEL_ID

CMPL = "/v1/completions"


def complete(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "prompt": prompt, **extra}


def test_single_prompt(client: TestClient) -> None:
    """OAI-EP-02, OAI-CMPL-01, OAI-CMPL-04, OAI-CMPL-06: one choice, fingerprint, headers."""
    response = client.post(
        CMPL, json=complete("The capital of France is", temperature=0, max_tokens=6)
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["system_fingerprint"].startswith("millm:SmolLM2-135M-Instruct@")
    [choice] = body["choices"]
    assert choice["index"] == 0 and "Paris" in choice["text"]
    assert response.headers["X-miLLM-Steering"] == "none"
    assert response.headers["X-miLLM-Model"] == MODEL_ID


def test_prompt_list_gives_one_choice_each_seeded_separately(client: TestClient) -> None:
    """OAI-CMPL-02, OAI-CMPL-11, OAI-SEED-12: each prompt one choice, each seeded separately."""
    body = client.post(
        CMPL,
        json=complete(
            ["Once upon a time", "Once upon a time", "The sky"],
            temperature=1.0,
            max_tokens=10,
            seed=42,
        ),
    ).json()
    texts = [c["text"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert texts[0] == texts[1]
    alone = client.post(
        CMPL, json=complete("The sky", temperature=1.0, max_tokens=10, seed=42)
    ).json()
    assert alone["choices"][0]["text"] == texts[2]


def test_add_special_tokens_is_honoured(client: TestClient) -> None:
    """OAI-CMPL-05, OAI-TOKIDS-06: accepted; SmolLM2's tokenizer adds no BOS, so counts agree."""
    on = client.post(CMPL, json=complete("Hello", temperature=0, max_tokens=2)).json()
    off = client.post(
        CMPL, json=complete("Hello", temperature=0, max_tokens=2, add_special_tokens=False)
    ).json()
    assert on["usage"]["prompt_tokens"] == off["usage"]["prompt_tokens"] == 1


def test_streamed_completion(client: TestClient) -> None:
    """OAI-CMPL-03, REQ-000 open point 20: text_completion chunks, steering chunk, [DONE]."""
    with client.stream(
        "POST", CMPL, json=complete("One, two,", temperature=0, max_tokens=6, stream=True)
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["millm_steering"] == "none" and chunks[-1]["choices"] == []
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    plain = client.post(CMPL, json=complete("One, two,", temperature=0, max_tokens=6)).json()
    assert text == plain["choices"][0]["text"]


def test_empty_prompt_without_special_tokens_is_refused(client: TestClient) -> None:
    """OAI-CMPL-01: a prompt that tokenizes to nothing cannot be continued (400, names prompt)."""
    response = client.post(CMPL, json=complete("", add_special_tokens=False, max_tokens=2))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"
