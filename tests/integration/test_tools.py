"""Function calling on chat (OAI-TOOLS) with the real SmolLM2, in process.

SmolLM2's own template takes no tools, so the models directory
(tests/models.py) holds SmolLM2 under the three test templates
(tests/data/templates): one folder per call format, the weights symlinked, only
`chat_template.jinja` differing. A greedy few-shot history of three
`get_weather` calls (tests/chats.py) makes the model call in all three
formats. Tests are grouped by family (a module-scoped parametrized fixture),
so each model loads once and the kept prefix cache serves every request after
a family's first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.chats import (
    NAMED,
    PARIS,
    WEATHER,
    Replies,
    assert_weather_call,
    few_shot,
    post,
    two_city_chat,
)
from tests.conftest import ENGINE_THREADS, GGUF_ID, MODEL_ID, LocalClient, cache_dir
from tests.errors import error_of
from tests.models import FAMILIES, build_models_dir

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="session")
def tool_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_models_dir(tmp_path_factory.mktemp("tool-models"))


@pytest.fixture(scope="module")
def tools_client(
    tool_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path_factory.mktemp("tools-data"),
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=tool_models,
        queue_heartbeat=0.2,
    )
    server = Server(settings, preload=False)
    with LocalClient(server, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """The call format under test; tests run grouped by it (one load each)."""
    return str(request.param)


def body(family: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": f"SmolLM2-{family}",
        "messages": few_shot(),
        "tools": WEATHER,
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


def sse_data(client: TestClient, payload: dict[str, Any]) -> list[Any]:
    """The `data:` payloads of a stream, `[DONE]` kept as a string."""
    with client.stream("POST", CHAT, json={**payload, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["X-miLLM-Model"] == payload["model"]
        shown = payload.get("tools") and payload.get("tool_choice") != "none"
        family = payload["model"].removeprefix("SmolLM2-") if shown else None
        assert response.headers.get("X-miLLM-Tool-Format") == family
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    payloads = [line.removeprefix("data: ") for line in lines]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def assert_plain(choice: dict[str, Any]) -> None:
    """OAI-TOOLS-21: an unparsed reply is content with its usual finish_reason."""
    assert "tool_calls" not in choice["message"]
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in {"stop", "length"}


def function_of(reply: dict[str, Any]) -> dict[str, Any]:
    """The first call's `function` of a reply."""
    return dict(reply["choices"][0]["message"]["tool_calls"][0]["function"])


@pytest.fixture(scope="module")
def replies(tools_client: TestClient) -> Replies:
    return Replies(tools_client)


# -- refusals before any load --------------------------------------------------------


def test_forced_function_must_be_offered(tools_client: TestClient) -> None:
    """OAI-TOOLS-16: a forced name not in `tools` is 400 invalid_parameter, before any load."""
    choice = {"type": "function", "function": {"name": "get_time"}}
    response = tools_client.post(CHAT, json=body("hermes", tool_choice=choice))
    error = error_of(response, 400, "invalid_parameter", "tool_choice")
    assert "get_time" in error["message"]
    assert tools_client.app.state.manager.resident is None  # type: ignore[attr-defined]


def test_tool_choice_needs_tools_and_names_are_unique(tools_client: TestClient) -> None:
    """OAI-TOOLS-16: tool_choice without tools, or a name offered twice, is refused."""
    lone = {"model": "SmolLM2-hermes", "messages": few_shot(), "tool_choice": "required"}
    error_of(tools_client.post(CHAT, json=lone), 400, "invalid_parameter", "tool_choice")
    twice = body("hermes", tools=WEATHER + WEATHER)
    error_of(tools_client.post(CHAT, json=twice), 400, "invalid_parameter", "tools")
    assert tools_client.app.state.manager.resident is None  # type: ignore[attr-defined]


def test_scoring_refuses_tools(tools_client: TestClient) -> None:
    """OAI-TOOLS-27: tools on a scoring request is field_not_honoured naming `tools`."""
    payload = body("hermes", logprobs=True, max_tokens=1)
    error_of(tools_client.post(CHAT, json=payload), 400, "field_not_honoured", "tools")
    assert tools_client.app.state.manager.resident is None  # type: ignore[attr-defined]


def test_tools_refuse_a_response_format(tools_client: TestClient) -> None:
    """OAI-TOOLS-28: tools with a non-text response_format is 400 naming `tools`."""
    payload = body("hermes", response_format={"type": "json_object"})
    error_of(tools_client.post(CHAT, json=payload), 400, "response_format_unsupported", "tools")
    text = post(tools_client, body("hermes", response_format={"type": "text"}, max_tokens=1))
    assert text["choices"][0]["finish_reason"] in {"length", "tool_calls"}


# -- the three call formats ---------------------------------------------------------


def test_auto_shows_the_tools_and_parses_the_reply(family: str, replies: Replies) -> None:
    """OAI-TOOLS-01, -02, -03, -11, -12 (auto is the default), -21 (hermes answers a
    `<tool_response>` text: plain content)."""
    default = replies(body(family, max_tokens=1))
    auto = replies(body(family, tool_choice="auto", max_tokens=1))
    assert default["usage"]["prompt_tokens"] == auto["usage"]["prompt_tokens"]
    assert default["choices"] == auto["choices"]
    reply = replies(body(family, tool_choice="auto"))
    [choice] = reply["choices"]
    if family == "hermes":
        assert_plain(choice)
        assert "<tool_response>" in choice["message"]["content"]
        return
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert_weather_call(call)


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["OAI-TOOLS-14", "OAI-TOOLS-15"])
def test_forced_call(family: str, choice: Any, replies: Replies, tools_client: TestClient) -> None:
    """OAI-TOOLS-03, -04, -14, -15, -30, -32: a forced call, its opening part of the prompt;
    X-miLLM-Tool-Format names the template's format (OAI-TOOLS-11)."""
    response = tools_client.post(CHAT, json=body(family, tool_choice=choice))
    assert response.status_code == 200, response.text
    assert response.headers["X-miLLM-Model"] == f"SmolLM2-{family}"
    assert response.headers["X-miLLM-Steering"] == "none"
    assert response.headers["X-miLLM-Tool-Format"] == family
    reply = response.json()
    [only] = reply["choices"]
    assert only["finish_reason"] == "tool_calls"
    assert {"role", "content", "tool_calls"} <= set(only["message"])
    assert set(only["message"]) <= {"role", "content", "tool_calls", "refusal"}
    assert only["message"]["role"] == "assistant" and only["message"]["content"] is None
    [call] = only["message"]["tool_calls"]
    assert_weather_call(call)
    auto = replies(body(family, tool_choice="auto", max_tokens=1))
    assert reply["usage"]["prompt_tokens"] > auto["usage"]["prompt_tokens"]  # the opening


def test_streamed_forced_call(family: str, tools_client: TestClient) -> None:
    """OAI-TOOLS-01, -05, -06, -07, -30: the call whole in one delta, then finish tool_calls."""
    events = sse_data(tools_client, body(family, tool_choice=NAMED))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["millm_steering"] == "none"
    final = chunks[-2]
    assert final["choices"][0]["finish_reason"] == "tool_calls"
    assert final["usage"]["completion_tokens"] > 0
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-2]]
    with_calls = [i for i, d in enumerate(deltas) if "tool_calls" in d]
    assert len(with_calls) == 1, deltas
    [call] = deltas[with_calls[0]]["tool_calls"]
    assert_weather_call(call, streamed=True)
    assert not any(d.get("content") for d in deltas), deltas  # forced: no text before it


def test_streamed_auto_matches_the_reply(
    family: str, replies: Replies, tools_client: TestClient
) -> None:
    """OAI-TOOLS-05, -06, -07, -21: content only before the call; an unparsed reply's held
    text comes out as content with its usual finish_reason."""
    reply = replies(body(family, tool_choice="auto"))["choices"][0]
    chunks = sse_data(tools_client, body(family, tool_choice="auto"))[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-2]]
    finish = chunks[-2]["choices"][0]["finish_reason"]
    assert finish == reply["finish_reason"]
    calls = [i for i, d in enumerate(deltas) if "tool_calls" in d]
    text = "".join(d.get("content") or "" for d in deltas)
    if "tool_calls" not in reply["message"]:
        assert calls == [] and text == reply["message"]["content"]
        return
    assert len(calls) == 1 and not any(d.get("content") for d in deltas[calls[0] :])
    assert text == (reply["message"]["content"] or "")
    [call] = deltas[calls[0]]["tool_calls"]
    assert_weather_call(call, streamed=True)


def test_history_arguments_as_string_or_object(family: str, replies: Replies) -> None:
    """OAI-TOOLS-18: a history call's arguments render the same as JSON string or object."""
    as_string = replies(body(family, tool_choice=NAMED))
    as_object = replies(body(family, tool_choice=NAMED, messages=few_shot(as_object=True)))
    assert as_object["usage"]["prompt_tokens"] == as_string["usage"]["prompt_tokens"]
    assert as_object["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert function_of(as_object) == function_of(as_string)


def test_tool_results_are_rendered(family: str, replies: Replies) -> None:
    """OAI-TOOLS-19, -21, -32: a longer tool result is a longer prompt; a call cut short is
    plain content (finish "length"), without the forced opening."""
    short = replies(body(family, tool_choice=NAMED, max_tokens=1))
    longer = few_shot(last_result="3 C, with wind from the north and light snow")
    long = replies(body(family, tool_choice=NAMED, max_tokens=1, messages=longer))
    assert long["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"]
    [choice] = short["choices"]
    assert_plain(choice)
    assert choice["finish_reason"] == "length"
    assert "get_weather" not in choice["message"]["content"]


@pytest.mark.parametrize("family", ["lfm2", "llama3"], indirect=True)
def test_a_call_to_a_function_not_offered_is_content(
    family: str, replies: Replies, tools_client: TestClient
) -> None:
    """OAI-TOOLS-21: the history's get_weather called where only get_time is offered: the
    call is returned as plain content, streamed or not, with finish "stop"."""
    get_time = {**WEATHER[0]["function"], "name": "get_time", "description": "Get the time"}
    ask = body(family, tools=[{"type": "function", "function": get_time}])
    [choice] = replies(ask)["choices"]
    assert_plain(choice)
    assert "get_weather" in choice["message"]["content"] and choice["finish_reason"] == "stop"
    chunks = sse_data(tools_client, ask)[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-2]]
    assert not any("tool_calls" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == choice["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


# -- one model each -------------------------------------------------------------------


@pytest.mark.parametrize("family", ["lfm2"], indirect=True)
def test_parallel_tool_calls_false_gives_at_most_one(family: str, replies: Replies) -> None:
    """OAI-TOOLS-17: where the model calls twice (each history turn does), parallel_tool_calls
    false returns one call."""
    messages = two_city_chat()
    ask = body(family, messages=messages, tool_choice="required")
    both = replies(ask)["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in both] == [PARIS, {"city": "Madrid"}]
    one = replies({**ask, "parallel_tool_calls": False})["choices"][0]
    assert one["finish_reason"] == "tool_calls"
    [call] = one["message"]["tool_calls"]
    assert_weather_call(call)


@pytest.mark.parametrize("family", ["hermes"], indirect=True)
def test_tool_choice_none_hides_the_tools(family: str, replies: Replies) -> None:
    """OAI-TOOLS-13: "none" renders no tools (a shorter prompt) and parses nothing, even a
    reply that reads like a call."""
    auto = replies(body(family, tool_choice="auto", max_tokens=1))
    none = replies(body(family, tool_choice="none"))
    assert none["usage"]["prompt_tokens"] < auto["usage"]["prompt_tokens"]
    [choice] = none["choices"]
    assert_plain(choice)


# -- templates that cannot take tools -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
def test_templates_with_an_unknown_call_format_refuse_tools(
    tools_client: TestClient, stream: bool
) -> None:
    """OAI-TOOLS-24: a template that takes tools in a format none reads: field_not_honoured
    naming `tools`, once resident, before a 200. (A template that takes no tools is served in
    the generic format: tests/integration/test_tools_generic.py.)"""
    payload = body("plain", model="SmolLM2-gemma", stream=stream)
    error_of(tools_client.post(CHAT, json=payload), 400, "field_not_honoured", "tools")
    resident = tools_client.app.state.manager.resident  # type: ignore[attr-defined]
    assert resident is not None and resident.entry.model_id == "SmolLM2-gemma"


def test_a_template_without_tools_is_served_generic(tools_client: TestClient) -> None:
    """OAI-TOOLS-23 (superseded): the plain template takes no tools, so the tools are shown by
    the server in the generic format, as the header says."""
    response = tools_client.post(CHAT, json=body("plain", tool_choice=NAMED))
    assert response.status_code == 200, response.text
    assert response.headers["X-miLLM-Tool-Format"] == "generic"
    [call] = response.json()["choices"][0]["message"]["tool_calls"]
    assert_weather_call(call)


def test_gguf_takes_tool_history(tools_client: TestClient) -> None:
    """OAI-TOOLS-33, OAI-GGUF-01: llama.cpp honours tools, so tool-call history on GGUF is
    used (rendered as the generic format renders it), never reported as ignored."""
    messages = [*few_shot()[:4], {"role": "user", "content": "And in Paris?"}]
    payload = {"model": GGUF_ID, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = tools_client.post(CHAT, json=payload)
    assert response.status_code == 200, response.text
    ignored = response.headers.get("X-miLLM-Ignored-Fields", "")
    assert "tool_calls" not in ignored and "tool_call_id" not in ignored
