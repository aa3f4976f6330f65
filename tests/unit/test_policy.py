"""The field matrix (spec/policy/fields.yaml) as the policy reads it."""

from __future__ import annotations

from typing import Any

import pytest

from miserver.engines.llamacpp import CAPABILITIES as LLAMACPP_CAPS
from miserver.errors import FieldNotHonoured
from miserver.serving.policy import is_no_change, matrix, review, verdict

CAPS = frozenset({"generate", "chat", "seed"})
USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 1),
        ("logprobs", False),
        ("response_format", {"type": "text"}),
        ("tools", []),
        ("tool_choice", "none"),
        ("parallel_tool_calls", True),
        ("logit_bias", {}),
        ("pooling", "mean"),
        ("normalize", False),
        ("scoring_precision", "native"),
    ],
    ids=lambda v: f"OAI-VALID-31-{v}" if isinstance(v, str) else None,
)
def test_no_change_values_are_accepted_and_not_reported(field: str, value: Any) -> None:
    """OAI-VALID-31: no-change values pass on chat and completions, neither refused nor reported."""
    assert is_no_change(field, value)
    assert (
        review("chat", {"model": "m", "messages": USER, field: value}, "transformers", CAPS) == []
    )


def test_explicit_null_means_no_change() -> None:
    """OAI-VALID-32: an explicit null for any field is accepted everywhere."""
    body = {
        "model": "m",
        "messages": USER,
        **{name: None for name in matrix().endpoints["chat"] if name not in {"model", "messages"}},
    }
    assert review("chat", body, "transformers", CAPS) == []


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_explicit_null_for_unknown_fields_is_no_change(endpoint: str) -> None:
    """OAI-VALID-32: a null unknown field, top-level or nested, is neither reported nor
    refused, while the same fields with values are reported."""
    base: dict[str, Any] = {
        "chat": {"messages": USER},
        "completions": {"prompt": "Hi"},
        "embeddings": {"input": "Hi"},
    }[endpoint]

    def body(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"model": "m", **base, "foo_bar": value, "user": value}
        if endpoint != "embeddings":
            out |= {"stream": True, "stream_options": {"include_usage": True, "baz": value}}
        if endpoint == "chat":
            out["messages"] = [{"role": "user", "content": "Hi", "weight": value}]
        return out

    assert review(endpoint, body(None), "transformers", CAPS) == []
    reported = review(endpoint, body(1), "transformers", CAPS)
    assert "foo_bar" in reported
    if endpoint == "chat":
        assert {"stream_options.baz", "messages[0].weight"} <= set(reported)


def test_user_and_undeclared_fields_are_reported_by_location() -> None:
    """OAI-VALID-02, OAI-VALID-03, OAI-VALID-13: `user`, unknown members, nested ones too."""
    body = {
        "model": "m",
        "user": "u",
        "foo": {"x": 1},
        "stream": True,
        "stream_options": {"include_usage": True, "bar": 1},
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b", "name": "n", "weight": 1},
        ],
    }
    assert review("chat", body, "transformers", CAPS) == [
        "user",
        "messages[1].name",
        "foo",
        "stream_options.bar",
        "messages[1].weight",
    ]


def test_stream_options_without_stream_is_reported() -> None:
    """OAI-VALID-02: stream_options is unused when the request does not stream."""
    body = {"model": "m", "messages": USER, "stream_options": {"include_usage": True}}
    assert review("chat", body, "transformers", CAPS) == ["stream_options"]


def test_free_form_objects_are_not_walked() -> None:
    """OAI-VALID-02: members of free-form objects (template kwargs) are the template's business."""
    body = {"model": "m", "messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    assert review("chat", body, "transformers", CAPS) == []


def test_tool_history_is_reported_on_gguf() -> None:
    """OAI-VALID-02: tool calls in the history are reported where tools are not honoured."""
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
    }
    assert review("chat", body, "gguf", frozenset({"generate", "chat"})) == [
        "messages[1].tool_calls",
        "messages[2].tool_call_id",
    ]


def test_chat_template_kwargs_is_reported_on_gguf() -> None:
    """OAI-VALID-14, OAI-GGUF-11: llama.cpp takes no template variables."""
    body = {"model": "m", "messages": USER, "chat_template_kwargs": {"enable_thinking": False}}
    assert review("chat", body, "gguf", frozenset()) == ["chat_template_kwargs"]


def test_gguf_column_refuses_batched_chat() -> None:
    """OAI-VALID-15, OAI-VALID-17: the GGUF column of the matrix refuses batched chat."""
    body = {"model": "m", "messages": USER, "extra_messages": [USER]}
    with pytest.raises(FieldNotHonoured) as info:
        review("chat", body, "gguf", LLAMACPP_CAPS)
    assert info.value.param == "extra_messages"


@pytest.mark.parametrize("field", ["steering", "profile", "steering_intensity"])
def test_gguf_column_honours_steering(field: str) -> None:
    """Issue 46 (contract 0.25.0 supersedes OAI-VALID-24's and OAI-INL-24's GGUF refusal):
    llama.cpp steers, so the steering fields are honoured on GGUF: neither refused nor
    reported."""
    value: Any = {"features": [{"index": 1, "strength": 1.0}]} if field == "steering" else 1
    body = {"model": "m", "messages": USER, field: value}
    assert review("chat", body, "gguf", LLAMACPP_CAPS) == []


@pytest.mark.parametrize(
    ("endpoint", "field", "value"),
    [
        ("chat", "logprobs", True),
        ("chat", "top_logprobs", 2),
        ("chat", "allowed_token_ids", [1]),
        ("chat", "logit_bias", {"1": 5}),
        ("completions", "logprobs", 2),
        ("completions", "echo", True),
        ("completions", "logit_bias", {"1": 5}),
    ],
    ids=[
        "OAI-VALID-17-chat-logprobs",
        "top_logprobs",
        "OAI-VALID-17-chat-allowed",
        "OAI-VALID-29-chat",
        "OAI-VALID-17-completions",
        "echo",
        "OAI-VALID-29-completions",
    ],
)
def test_gguf_column_honours_logprobs(endpoint: str, field: str, value: Any) -> None:
    """Contract 0.17.0 (docs/DECISIONS.md; OAI-VALID-17's GGUF refusal and OAI-VALID-29 are
    superseded): the GGUF column honours logprobs, scoring, echo and logit_bias."""
    body = {"model": "m", field: value}
    body.update({"messages": USER} if endpoint == "chat" else {"prompt": "Hi"})
    assert review(endpoint, body, "gguf", LLAMACPP_CAPS) == []


@pytest.mark.parametrize(
    ("endpoint", "field", "value"),
    [
        ("chat", "seed", 1),
        ("completions", "seed", 1),
        ("chat", "n", 2),
        ("chat", "response_format", {"type": "json_object"}),
        ("chat", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("chat", "tool_choice", "auto"),
        ("chat", "parallel_tool_calls", False),
    ],
    ids=[
        "OAI-VALID-20",
        "OAI-VALID-20-completions",
        "OAI-VALID-21",
        "OAI-VALID-19",
        "OAI-TOOLS-22",
        "OAI-TOOLS-22-tool_choice",
        "OAI-TOOLS-22-parallel_tool_calls",
    ],
)
def test_gguf_column_honours_what_llama_cpp_now_does(endpoint: str, field: str, value: Any) -> None:
    """OAI-VALID-15, OAI-GGUF-01 (contract extension: OAI-SEED-13, OAI-SO-11, OAI-TOOLS-22
    superseded): seeds, `n`, structured output and tools are honoured on GGUF, by the
    capabilities the llama.cpp engine declares; an engine without them is "not
    implemented"."""
    prompt = {"messages": USER} if endpoint == "chat" else {"prompt": "Hi"}
    body = {"model": "m", **prompt, field: value}
    assert review(endpoint, body, "gguf", LLAMACPP_CAPS) == []
    if field != "n":
        with pytest.raises(FieldNotHonoured, match="not implemented"):
            review(endpoint, body, "gguf", frozenset({"generate", "chat"}))


def test_needs_rules_follow_capabilities() -> None:
    """OAI-VALID-01: a capability the engine has is honoured; a missing one is pending."""
    assert verdict({"needs": "seed"}, "transformers", CAPS) == "honoured"
    assert verdict({"needs": "scoring"}, "transformers", CAPS) == "pending"
    assert verdict({"needs": "tools", "else": "ignored"}, "transformers", CAPS) == "ignored"


def test_every_endpoint_field_is_declared_in_the_schema() -> None:
    """OAI-VALID-01: the matrix and the OpenAPI request schemas name the same fields."""
    from miserver.serving.request_schemas import v1_schema

    for endpoint, rules in matrix().endpoints.items():
        declared = v1_schema().request(endpoint).properties()
        assert declared is not None
        assert set(rules) == set(declared), endpoint
