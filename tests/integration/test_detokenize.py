"""POST /api/detokenize: each token id's own text, by the resident model's tokenizer
(contract 0.16.0; the web UI's activation heatmap names prompt tokens with it)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from tests.conftest import JSON, MODEL_ID


@pytest.mark.model
def test_each_id_comes_back_as_its_own_piece(client: TestClient) -> None:
    """The pieces of a text's ids, in order, put the text back together; each piece is the
    tokenizer's own decoding of that id alone; the answer names the resident model."""
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    ids = engine.tokenize("The lighthouse keeper waved.", add_special_tokens=False)
    answer = client.post("/api/detokenize", json={"tokens": ids})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == MODEL_ID
    assert body["pieces"] == [engine.token_text(i) for i in ids]
    assert "".join(body["pieces"]) == "The lighthouse keeper waved."


@pytest.mark.model
def test_an_id_outside_the_vocabulary_is_refused(client: TestClient) -> None:
    """An id past the vocabulary is `400 invalid_parameter` naming its place."""
    answer = client.post("/api/detokenize", json={"tokens": [1, 10_000_000]})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (
        400,
        "invalid_parameter",
        "tokens[1]",
    )


def test_bad_bodies_and_no_model(bare_client: TestClient) -> None:
    """A body the schema refuses is 400 (LOC-GEN-16's `invalid_request` for a wrong type,
    the schema's own refusal for an empty list or a negative id); with no model loaded the
    answer is `503 no_model`."""
    for body in ({"tokens": "1 2 3"}, {"tokens": []}, {"tokens": [-1]}, {}):
        answer = bare_client.post("/api/detokenize", json=body)
        assert answer.status_code == 400, (body, answer.text)
    answer = bare_client.post("/api/detokenize", json={"tokens": [1]}, headers=JSON)
    assert (answer.status_code, answer.json()["error"]["code"]) == (503, "no_model")
