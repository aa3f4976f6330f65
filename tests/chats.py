"""Chats that steer the greedy SmolLM2 into calling tools or reasoning, and checks on replies.

Each few-shot history ends in a question the model answers the way its turns
did: `few_shot` calls `get_weather` for Paris, `two_city_chat` calls it twice,
`capitals` reasons (under the Qwen3-style template) and then answers.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

CHAT = "/v1/chat/completions"

WEATHER: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PARIS = {"city": "Paris"}


def few_shot(*, as_object: bool = False, last_result: str = "3 C") -> list[dict[str, Any]]:
    """Three asked-called-answered turns, then the question the model should call for.

    `as_object` sends the history's `arguments` as objects instead of JSON
    strings; `last_result` is the last tool message's content.
    """
    messages: list[dict[str, Any]] = []
    for city, result in [("London", "12 C"), ("Rome", "25 C"), ("Oslo", last_result)]:
        arguments: Any = {"city": city} if as_object else json.dumps({"city": city})
        call = {"name": "get_weather", "arguments": arguments}
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call_{city}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{city}", "content": result},
            {"role": "assistant", "content": f"It is {result} in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Paris?"}]


def two_city_chat() -> list[dict[str, Any]]:
    """Two turns that each call get_weather twice, then a question about two cities."""
    messages: list[dict[str, Any]] = []
    for first, second in [("London", "Rome"), ("Oslo", "Bern")]:
        calls = [
            {
                "id": f"call_{city}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for city in (first, second)
        ]
        messages += [
            {"role": "user", "content": f"What is the weather in {first} and {second}?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"call_{first}", "content": "12 C"},
            {"role": "tool", "tool_call_id": f"call_{second}", "content": "20 C"},
            {"role": "assistant", "content": f"{first}: 12 C. {second}: 20 C."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Paris and Madrid?"}]


def capitals(*, reasoning: bool = True) -> list[dict[str, Any]]:
    """Three asked-reasoned-answered turns, then the question to answer."""
    messages: list[dict[str, Any]] = []
    for country, city in [("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo")]:
        answer: dict[str, Any] = {"role": "assistant", "content": f"{city}."}
        if reasoning:
            answer["reasoning_content"] = (
                f"The user asks for the capital of {country}. It is {city}."
            )
        messages += [{"role": "user", "content": f"What is the capital of {country}?"}, answer]
    return [*messages, {"role": "user", "content": "What is the capital of France?"}]


def assert_weather_call(call: dict[str, Any], *, streamed: bool = False) -> None:
    """OAI-TOOLS-04 / -06: one call in OpenAI's shape, its arguments a whole JSON string."""
    keys = {"index", "id", "type", "function"} if streamed else {"id", "type", "function"}
    assert set(call) == keys, call
    assert call["id"].startswith("call_") and len(call["id"]) > len("call_")
    assert call["type"] == "function"
    assert set(call["function"]) == {"name", "arguments"}
    assert call["function"]["name"] == "get_weather"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == PARIS
    if streamed:
        assert call["index"] == 0


def post(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    """A chat completion answered 200: its body."""
    response = client.post(CHAT, json=payload)
    assert response.status_code == 200, response.text
    return dict(response.json())


class Replies:
    """Each distinct request answered once per module (greedy replies repeat)."""

    def __init__(self, client: TestClient) -> None:
        self._client = client
        self._seen: dict[str, dict[str, Any]] = {}

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        key = json.dumps(payload, sort_keys=True)
        if key not in self._seen:
            self._seen[key] = post(self._client, payload)
        return self._seen[key]
