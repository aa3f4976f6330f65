"""Refusals that need no model: every one in OpenAI's error shape, none loads a model."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import GGUF_ID, JSON, MODEL_ID
from tests.errors import assert_nothing_loaded, error_of

USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER}, "model"),
        ({"model": MODEL_ID}, "messages"),
        ({"model": MODEL_ID, "messages": []}, "messages"),
        ({"model": MODEL_ID, "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": MODEL_ID, "messages": USER, "temperature": 2.5}, "temperature"),
        ({"model": MODEL_ID, "messages": USER, "top_p": -0.1}, "top_p"),
        ({"model": MODEL_ID, "messages": USER, "frequency_penalty": 3}, "frequency_penalty"),
        ({"model": MODEL_ID, "messages": USER, "presence_penalty": -2.5}, "presence_penalty"),
        ({"model": MODEL_ID, "messages": USER, "seed": -1}, "seed"),
        ({"model": MODEL_ID, "messages": USER, "seed": 4294967296}, "seed"),
        ({"model": MODEL_ID, "messages": USER, "seed": True}, "seed"),
        ({"model": MODEL_ID, "messages": USER, "seed": "7"}, "seed"),
        ({"model": MODEL_ID, "messages": USER, "seed": 1.5}, "seed"),
        ({"model": MODEL_ID, "messages": USER, "stop": 5}, "stop"),
        ({"model": MODEL_ID, "messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL_ID, "messages": USER, "steering_intensity": 2.5}, "steering_intensity"),
        ({"model": MODEL_ID, "messages": USER, "steering_intensity": "loud"}, "steering_intensity"),
    ],
    ids=[
        "OAI-CHAT-01",
        "OAI-CHAT-03",
        "OAI-CHAT-03-empty",
        "OAI-CHAT-04-missing",
        "OAI-CHAT-06",
        "OAI-CHAT-08",
        "OAI-CHAT-22",
        "OAI-CHAT-23",
        "OAI-SEED-02-negative",
        "OAI-SEED-02-big",
        "OAI-SEED-02-bool",
        "OAI-SEED-02-string",
        "OAI-SEED-02-float",
        "OAI-CHAT-19",
        "LOC-CHAT-24",
        "OAI-CHAT-28-range",
        "OAI-CHAT-28-symbol",
    ],
)
def test_schema_violations_name_the_field(
    bare_client: TestClient, body: dict[str, Any], param: str
) -> None:
    """OAI-ERR-01: schema violations are 400 invalid_parameter with `param` as the field path."""
    error = error_of(
        bare_client.post("/v1/chat/completions", json=body), 400, "invalid_parameter", param
    )
    assert error["type"] == "invalid_request_error"
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "robot", "content": "x"}],
        [{"role": 7, "content": "x"}],
        [{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}],
    ],
    ids=["LOC-CHAT-04-unknown", "LOC-CHAT-04-number", "LOC-CHAT-04-second"],
)
def test_an_unknown_role_is_invalid_request(
    bare_client: TestClient, messages: list[dict[str, Any]]
) -> None:
    """LOC-CHAT-04, OAI-CHAT-04: a role outside system/developer/user/assistant/tool/function
    (or not a string) is 400 `invalid_request` naming the message's role; nothing loads."""
    body = {"model": MODEL_ID, "messages": messages}
    param = f"messages[{len(messages) - 1}].role"
    error = error_of(
        bare_client.post("/v1/chat/completions", json=body), 400, "invalid_request", param
    )
    assert error["type"] == "invalid_request_error"
    assert_nothing_loaded(bare_client)


def test_invalid_json_is_a_400(bare_client: TestClient) -> None:
    """OAI-ERR-01: a body that is not JSON."""
    response = bare_client.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    error_of(response, 400, "invalid_json", None)


def test_unknown_route_and_method(bare_client: TestClient) -> None:
    """OAI-ERR-01: unknown paths (404) and wrong methods (405) are OpenAI errors too."""
    error_of(bare_client.get("/v1/nothing-here"), 404, "not_found", None)
    error_of(bare_client.delete("/v1/models", headers=JSON), 405, "method_not_allowed", None)


def test_unknown_model(bare_client: TestClient) -> None:
    """OAI-CHAT-02, OAI-ERR-03: an unknown name is 404 model_not_found, before any load."""
    body = {"model": "no-such-model", "messages": USER}
    error_of(bare_client.post("/v1/chat/completions", json=body), 404, "model_not_found", "model")
    error_of(bare_client.get("/v1/models/no-such-model"), 404, "model_not_found", "model")
    assert_nothing_loaded(bare_client)


def test_models_listing(bare_client: TestClient) -> None:
    """OAI-MODELS-01..03, OAI-MODELS-06, OAI-MODELS-07, OAI-EP-04, OAI-EP-05."""
    listing = bare_client.get("/v1/models").json()
    assert listing["object"] == "list"
    ids = [m["id"] for m in listing["data"]]
    assert MODEL_ID in ids and f"{MODEL_ID}:Q4_1" in ids  # the conversion and the GGUF
    for model in listing["data"]:
        assert set(model) == {"id", "object", "created", "owned_by", "state"}
        assert model["object"] == "model" and isinstance(model["created"], int)
        assert model["state"] == "READY"  # nothing loaded yet (OAI-MODELS-03)
    one = bare_client.get(f"/v1/models/{MODEL_ID}").json()
    assert one == next(m for m in listing["data"] if m["id"] == MODEL_ID)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dimensions", 64),
        ("pooling", "cls"),
        ("normalize", True),
        ("scoring_precision", "float32"),
    ],
    ids=["OAI-VALID-25", "OAI-VALID-26", "OAI-VALID-27", "OAI-VALID-30"],
)
def test_chat_refuses_fields_it_cannot_honour(
    bare_client: TestClient, field: str, value: Any
) -> None:
    """OAI-VALID-15, OAI-VALID-16, OAI-ERR-10: field_not_honoured naming it, before any load."""
    body = {"model": MODEL_ID, "messages": USER, field: value}
    error_of(bare_client.post("/v1/chat/completions", json=body), 400, "field_not_honoured", field)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("top_logprobs", 2),
        ("response_format", {"type": "json_object"}),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("parallel_tool_calls", False),
        ("best_of", 2),
        ("suffix", "x"),
        ("dimensions", 8),
        ("pooling", "last"),
        ("normalize", True),
    ],
    ids=[
        "OAI-CMPL-07",
        "OAI-CMPL-08",
        "OAI-CMPL-09",
        "OAI-CMPL-10-tools",
        "OAI-CMPL-10-tool_choice",
        "OAI-CMPL-10-parallel",
        "best_of",
        "suffix",
        "OAI-VALID-25",
        "OAI-VALID-26",
        "OAI-VALID-27",
    ],
)
def test_completions_refuse_fields_they_cannot_honour(
    bare_client: TestClient, field: str, value: Any
) -> None:
    """OAI-VALID-15, OAI-VALID-16, OAI-VALID-21: field_not_honoured before any load."""
    body = {"model": MODEL_ID, "prompt": "Hi", field: value}
    error_of(bare_client.post("/v1/completions", json=body), 400, "field_not_honoured", field)
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize("model", [MODEL_ID, GGUF_ID], ids=["transformers", "gguf"])
def test_activations_refused_before_any_load(bare_client: TestClient, model: str) -> None:
    """OAI-ACT-19: with no SAE attached, 400 naming the field, before any load; on a GGUF
    model too (contract 0.26.0 supersedes OAI-ACT-24's field_not_honoured there)."""
    ask = {"top_k": 4}
    for path, body in (
        ("/v1/completions", {"model": model, "prompt": "Hi", "return_sae_activations": ask}),
        ("/v1/chat/completions", {"model": model, "messages": USER, "return_sae_activations": ask}),
    ):
        error = error_of(
            bare_client.post(path, json=body), 400, "invalid_parameter", "return_sae_activations"
        )
        assert "no SAE is attached" in error["message"]
        assert_nothing_loaded(bare_client)


def test_n_with_stream_is_refused(bare_client: TestClient) -> None:
    """OAI-CHAT-10."""
    body = {"model": MODEL_ID, "messages": USER, "n": 2, "stream": True}
    error_of(bare_client.post("/v1/chat/completions", json=body), 400, "invalid_parameter", "n")
    assert_nothing_loaded(bare_client)


def test_differing_max_tokens_are_refused_naming_both(bare_client: TestClient) -> None:
    """OAI-CHAT-12."""
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 5, "max_completion_tokens": 6}
    error = error_of(
        bare_client.post("/v1/chat/completions", json=body),
        400,
        "invalid_parameter",
        "max_completion_tokens",
    )
    assert "max_tokens" in error["message"] and "max_completion_tokens" in error["message"]


def test_bad_strict_header_is_refused(bare_client: TestClient) -> None:
    """OAI-VALID-12: any other X-miLLM-Strict value is 400 naming the header."""
    body = {"model": MODEL_ID, "messages": USER}
    response = bare_client.post(
        "/v1/chat/completions", json=body, headers={"X-miLLM-Strict": "yes"}
    )
    error_of(response, 400, "invalid_parameter", "X-miLLM-Strict")


def test_strict_mode_names_every_unused_location(bare_client: TestClient) -> None:
    """OAI-VALID-10, OAI-VALID-13, OAI-ERR-11: strict refuses `user` and unknown fields by name."""
    body = {
        "model": MODEL_ID,
        "user": "u1",
        "foo": 1,
        "messages": [{"role": "user", "content": "Hi", "name": "n", "weight": 2}],
    }
    response = bare_client.post(
        "/v1/chat/completions", json=body, headers={"X-miLLM-Strict": "true"}
    )
    error = error_of(response, 400, "unused_fields_refused", "user")
    for location in ["user", "foo", "messages[0].name", "messages[0].weight"]:
        assert location in error["message"]
    assert_nothing_loaded(bare_client)
