"""Function calling in the generic format with the real SmolLM2 (transformers), in process.

SmolLM2's own chat template takes no tools, so the default model is served in
the generic format: the server lists the tools in the system turn, the reply
is constrained to one JSON document (calls or content), and tool history is
rendered by the server. The greedy few-shot history of tests/chats.py makes
the model call `get_weather` for Paris; after a tool result it answers in words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.serving.chat import generic
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
from tests.models import build_models_dir

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
HEADER = "X-miLLM-Tool-Format"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The default model (SmolLM2's own template), and SmolLM2 without a template."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path_factory.mktemp("generic-data"),
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=build_models_dir(tmp_path_factory.mktemp("generic-models")),
        queue_heartbeat=0.2,
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def replies(client: TestClient) -> Replies:
    return Replies(client)


def ask(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL_ID,
        "messages": few_shot(),
        "tools": WEATHER,
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


def answered() -> list[dict[str, Any]]:
    """The few-shot chat, then the Paris call and its result: the model answers in words."""
    call = {"name": "get_weather", "arguments": json.dumps(PARIS)}
    return [
        *few_shot(),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_Paris", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call_Paris", "content": "18 C"},
    ]


def stream(client: TestClient, payload: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The choice deltas of a stream, its finish reason; the tool-format header is checked."""
    with client.stream("POST", CHAT, json={**payload, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers[HEADER] == "generic"
        lines = [line.removeprefix("data: ") for line in response.iter_lines()]
    chunks = [json.loads(line) for line in lines if line.startswith("{")]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    finish = next(c["finish_reason"] for c in choices if c["finish_reason"])
    return [c["delta"] for c in choices], finish


# -- calls --------------------------------------------------------------------------


def test_the_default_model_calls_tools(client: TestClient) -> None:
    """OAI-TOOLS-01, -03, -04, -12 in the generic format (OAI-TOOLS-23's refusal superseded):
    SmolLM2's template takes no tools, yet `auto` gets a call, and the header says so."""
    response = client.post(CHAT, json=ask())
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == "generic"
    assert response.headers["X-miLLM-Model"] == MODEL_ID
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert_weather_call(call)


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["OAI-TOOLS-14", "OAI-TOOLS-15"])
def test_forced_calls(replies: Replies, choice: Any) -> None:
    """OAI-TOOLS-14, -15 (generic): the grammar allows only a calls document (of the named
    function); nothing is opened in the prompt."""
    [only] = replies(ask(tool_choice=choice))["choices"]
    assert only["finish_reason"] == "tool_calls" and only["message"]["content"] is None
    [call] = only["message"]["tool_calls"]
    assert_weather_call(call)


def test_parallel_tool_calls_false_gives_one_call(replies: Replies) -> None:
    """OAI-TOOLS-17 (generic): where the model calls twice (parallel calls asked for), the
    document holds one call with parallel_tool_calls false, and with it left out (the generic
    format's default, as llama.cpp's server's)."""
    both = replies(ask(messages=two_city_chat(), max_tokens=60, parallel_tool_calls=True))
    both = both["choices"][0]
    assert both["finish_reason"] == "tool_calls"
    cities = [json.loads(c["function"]["arguments"]) for c in both["message"]["tool_calls"]]
    assert cities == [PARIS, {"city": "Madrid"}]
    for parallel in (False, None):
        one = replies(ask(messages=two_city_chat(), max_tokens=60, parallel_tool_calls=parallel))
        [call] = one["choices"][0]["message"]["tool_calls"]
        assert_weather_call(call)


def test_a_tool_result_is_answered_in_words(replies: Replies) -> None:
    """OAI-TOOLS-19, -21 (generic): after the call and its result (rendered by the server) the
    model answers with a content document: its text, never the JSON around it."""
    [choice] = replies(ask(messages=answered()))["choices"]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    content = choice["message"]["content"]
    assert "18" in content and "{" not in content and '"' not in content


# -- streams -------------------------------------------------------------------------


def test_streamed_call_is_one_delta(client: TestClient) -> None:
    """OAI-TOOLS-05, -06, -07 (generic): the calls document is held; the call arrives whole in
    one delta; no content delta; finish tool_calls."""
    deltas, finish = stream(client, ask())
    assert finish == "tool_calls"
    with_calls = [d for d in deltas if "tool_calls" in d]
    assert len(with_calls) == 1
    [call] = with_calls[0]["tool_calls"]
    assert_weather_call(call, streamed=True)
    assert not any(d.get("content") for d in deltas), deltas


def test_streamed_content_is_the_replys_text(client: TestClient, replies: Replies) -> None:
    """OAI-TOOLS-05, -21 (generic): a content document streams as its text, in pieces, with no
    JSON in any delta, and adds up to the non-streamed content."""
    payload = ask(messages=answered())
    whole = replies(payload)["choices"][0]["message"]["content"]
    deltas, finish = stream(client, payload)
    pieces = [d["content"] for d in deltas if d.get("content")]
    assert finish == "stop" and "".join(pieces) == whole
    assert len(pieces) > 1 and not any("{" in p or '"' in p for p in pieces)
    assert not any("tool_calls" in d for d in deltas)


# -- history, header, refusals -------------------------------------------------------


def plain_turns() -> list[dict[str, Any]]:
    """few_shot() as the plain turns the server renders it into (no tools shown)."""
    messages: list[dict[str, Any]] = []
    for message in few_shot():
        if message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            call = {"name": function["name"], "arguments": json.loads(function["arguments"])}
            messages.append({"role": "assistant", "content": json.dumps({"tool_calls": [call]})})
        elif message["role"] == "tool":
            result = {"name": "get_weather", "content": message["content"]}
            messages.append({"role": "user", "content": json.dumps({"tool_results": [result]})})
        else:
            messages.append(message)
    return messages


@pytest.mark.parametrize("model", [MODEL_ID, "SmolLM2-notemplate"], ids=["default", "none"])
def test_tool_history_is_rendered_by_the_server(client: TestClient, model: str) -> None:
    """OAI-TOOLS-18, -19 (generic; OAI-TOOLS-20's refusal superseded): without tools, a template
    that takes none (or no template) gets calls and results as plain turns, the same tokens
    as a client sending those turns; arguments as a string or an object alike."""
    base = {"model": model, "max_tokens": 1, "temperature": 0}
    counts = [
        post(client, {**base, "messages": messages})["usage"]["prompt_tokens"]
        for messages in (few_shot(), few_shot(as_object=True), plain_turns())
    ]
    assert counts[0] == counts[1] == counts[2]


def test_shown_tools_and_history_render_as_documents(client: TestClient, replies: Replies) -> None:
    """OAI-TOOLS-02, -18, -19 (generic): with tools shown, the prompt is the tool list in a
    system turn, calls and results as documents, and earlier answers as content documents."""
    system = generic.system_text(WEATHER, "auto", None, 1)  # one call: the default
    turns = [
        {**m, "content": json.dumps({"content": m["content"]})}
        if m["role"] == "assistant" and not m["content"].startswith('{"tool_calls"')
        else m
        for m in plain_turns()
    ]
    shown = replies(ask(max_tokens=1))
    explicit = post(
        client,
        {
            **ask(max_tokens=1),
            "tools": None,
            "messages": [{"role": "system", "content": system}, *turns],
        },
    )
    assert shown["usage"]["prompt_tokens"] == explicit["usage"]["prompt_tokens"]


def test_no_header_where_no_tools_were_shown(client: TestClient) -> None:
    """OAI-TOOLS-13: tool_choice "none" shows no tools: a plain chat, with no tool format."""
    response = client.post(CHAT, json=ask(tool_choice="none", max_tokens=1))
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers
    assert "tool_calls" not in response.json()["choices"][0]["message"]


def test_tools_still_refuse_a_response_format(client: TestClient) -> None:
    """OAI-TOOLS-28, OAI-SO-26: tools with a JSON response_format is refused, before any load,
    for the generic format as for the others."""
    payload = ask(response_format={"type": "json_object"})
    error_of(client.post(CHAT, json=payload), 400, "response_format_unsupported", "tools")


# -- the GGUF engine (llama.cpp, the same SmolLM2 file) ------------------------------


def test_gguf_serves_the_generic_format(client: TestClient, replies: Replies) -> None:
    """OAI-TOOLS-01, -03, -04, -12, OAI-TOKIDS-01 (generic, GGUF): llama.cpp gets the same
    rendered prompt as transformers and the same constrained call, and the header says so."""
    on_transformers = replies(ask(max_tokens=1))  # asked before, answered from the record
    response = client.post(CHAT, json=ask(model=GGUF_ID))
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == "generic"
    reply = response.json()
    assert reply["usage"]["prompt_tokens"] == on_transformers["usage"]["prompt_tokens"]
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert_weather_call(call)


def test_gguf_streams_content_and_forces_calls(client: TestClient) -> None:
    """OAI-TOOLS-05, -06, -15, -19 (generic, GGUF): a named call is forced by the grammar; a
    tool result is answered in content deltas with no JSON in them."""
    forced = post(client, ask(model=GGUF_ID, tool_choice=NAMED))
    [call] = forced["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    deltas, finish = stream(client, ask(model=GGUF_ID, messages=answered()))
    pieces = [d["content"] for d in deltas if d.get("content")]
    assert finish in {"stop", "length"} and pieces
    assert not any("{" in p or '"' in p for p in pieces)
    assert not any("tool_calls" in d for d in deltas)


def test_unicode_arguments_reach_the_client_unescaped(client: TestClient) -> None:
    """OAI-TOOLS-04 (issue 15; LangChain's test_unicode_tool_call_integration): a call's
    arguments keep non-ASCII text as it is, in the arguments string and on the wire, streamed
    or not (the enum holds SmolLM2 to the name, so the check is the server's, not the
    model's)."""
    name = "你好啊集团"
    tool = {
        "type": "function",
        "function": {
            "name": "create_customer",
            "parameters": {
                "type": "object",
                "properties": {"customer_name": {"type": "string", "enum": [name]}},
                "required": ["customer_name"],
            },
        },
    }
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": f"Create a customer named '{name}'."}],
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 60,
        "temperature": 0,
    }
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    arguments = response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"customer_name": name}
    assert name in arguments and name in response.text and "\\u" not in response.text
    with client.stream("POST", CHAT, json={**body, "stream": True}) as streamed:
        wire = "".join(streamed.iter_text())
    assert name in wire and "\\u" not in wire
