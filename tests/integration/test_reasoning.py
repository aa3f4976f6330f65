"""Chat additions of the local-server document with the real SmolLM2, in process: `developer`,
content parts, thinking on/off and reasoning spans (LOC-CHAT-03..08, -10, -29..32, -40, -41,
-57, -68).

SmolLM2 is served under the Qwen3-style test template (tests/data/templates/qwen3.jinja),
the way tests/integration/test_tools.py serves it under other templates (tests/models.py):
thinking off renders an empty `<think>` span in the generation prompt, thinking on opens
one, so the greedy model's reply starts inside a span. A few-shot history whose assistant
turns carry `reasoning_content` (rendered by the template as spans) teaches it to close
the span and answer: every split below is read off text the model generated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.settings import Settings
from tests.chats import WEATHER, capitals
from tests.conftest import ENGINE_THREADS, GGUF_ID, JSON, MODEL_ID, LocalClient, cache_dir
from tests.models import QWEN3, TEMPLATES, link_qwen3

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
MARKERS = ("<think>", "</think>")
HI = [{"role": "user", "content": "Hi"}]


def weather_calls() -> list[dict[str, Any]]:
    """Three turns that reason, call get_weather, then answer; then the question for Paris."""
    messages: list[dict[str, Any]] = []
    for city, result in [("London", "12 C"), ("Rome", "25 C"), ("Oslo", "3 C")]:
        call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"The user wants the weather in {city}. I call get_weather.",
                "tool_calls": [{"id": f"call_{city}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{city}", "content": result},
            {"role": "assistant", "content": f"It is {result} in {city}."},
        ]
    return [*messages, {"role": "user", "content": "What is the weather in Paris?"}]


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": QWEN3, "messages": capitals(), "max_tokens": 60, "temperature": 0, **extra}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return link_qwen3(tmp_path_factory.mktemp("reasoning-models"))


def serve(models: Path, data: Path) -> Server:
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=data,
        cache_dir=cache_dir(),
        model=MODEL_ID,
        models_dir=models,
        queue_heartbeat=0.2,
    )
    return Server(settings, preload=False)


@pytest.fixture(scope="module")
def client(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with LocalClient(
        serve(models, tmp_path_factory.mktemp("data")), raise_server_exceptions=False
    ) as c:
        yield c


@pytest.fixture
def bare(models: Path, tmp_path: Path) -> Iterator[TestClient]:
    """A server that has loaded nothing (refusals before any load)."""
    with LocalClient(serve(models, tmp_path / "data"), raise_server_exceptions=False) as c:
        yield c


def post(client: TestClient, payload: dict[str, Any], **headers: str) -> Any:
    return client.post(CHAT, json=payload, headers={**JSON, **headers})


def reply(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    response = post(client, payload)
    assert response.status_code == 200, response.text
    return dict(response.json())


def message(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    return dict(reply(client, payload)["choices"][0]["message"])


def prompt_tokens(client: TestClient, payload: dict[str, Any]) -> int:
    return int(reply(client, {**payload, "max_tokens": 1})["usage"]["prompt_tokens"])


def ignored(response: Any) -> str:
    return str(response.headers.get("X-miLLM-Ignored-Fields", ""))


def deltas(client: TestClient, payload: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A stream's choice deltas (role chunk and the final chunk left out) and finish reason."""
    with client.stream("POST", CHAT, json={**payload, "stream": True}, headers=JSON) as response:
        assert response.status_code == 200, response.read()
        lines = [line.removeprefix("data: ") for line in response.iter_lines()]
    chunks = [json.loads(p) for p in lines if p.startswith("{")]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    return [c["delta"] for c in choices[1:-1]], str(choices[-1]["finish_reason"])


def joined(parts: list[dict[str, Any]], key: str) -> str:
    return "".join(d.get(key) or "" for d in parts)


# -- refusals before any load --------------------------------------------------------


@pytest.mark.parametrize("model", [QWEN3, GGUF_ID], ids=["transformers", "gguf"])
@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "refusal", "refusal": "no"},
    ],
    ids=["LOC-CHAT-08-image", "LOC-CHAT-08-audio", "file", "other"],
)
def test_non_text_parts_are_refused_naming_the_part(
    bare: TestClient, model: str, part: dict[str, Any]
) -> None:
    """LOC-CHAT-08: an image, audio or any non-text part is 400 naming the part, never
    dropped, on both engines, before the model loads."""
    content = [{"type": "text", "text": "What is in this?"}, part]
    payload = {"model": model, "messages": [{"role": "user", "content": content}]}
    response = post(bare, payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == ("invalid_parameter", "messages[0].content[1].type")
    assert error["type"] == "invalid_request_error" and part["type"] in error["message"]
    batched = {
        "model": model,
        "messages": HI,
        "extra_messages": [[{"role": "user", "content": [part]}]],
    }
    error = post(bare, batched).json()["error"]
    assert error["param"] == "extra_messages[0][0].content[0].type"
    assert bare.app.state.manager.resident is None  # type: ignore[attr-defined]


# -- content and roles ---------------------------------------------------------------


@pytest.mark.parametrize("model", [QWEN3, GGUF_ID], ids=["transformers", "gguf"])
def test_text_parts_and_developer(client: TestClient, model: str) -> None:
    """LOC-CHAT-03, -05, -06: text parts read as their text; `developer` renders as `system`
    (the same prompt and the same greedy reply), on both engines."""
    base = {"model": model, "max_tokens": 6, "temperature": 0}
    question = "What is the capital of France?"
    as_string = reply(client, {**base, "messages": [{"role": "user", "content": question}]})
    parts = [
        {"type": "text", "text": "What is the capital"},
        {"type": "text", "text": " of France?"},
    ]
    as_parts = reply(client, {**base, "messages": [{"role": "user", "content": parts}]})
    assert as_parts["usage"]["prompt_tokens"] == as_string["usage"]["prompt_tokens"]
    assert as_parts["choices"] == as_string["choices"]

    def said(role: str) -> dict[str, Any]:
        system = {"role": role, "content": "Answer in one word."}
        return reply(client, {**base, "messages": [system, {"role": "user", "content": question}]})

    developer, system = said("developer"), said("system")
    assert developer["usage"]["prompt_tokens"] == system["usage"]["prompt_tokens"]
    assert developer["usage"]["prompt_tokens"] != as_string["usage"]["prompt_tokens"]
    assert developer["choices"] == system["choices"]


# -- thinking on/off -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "thinking", "unused"),
    [
        ({}, False, []),
        ({"think": True}, True, []),
        ({"think": False, "chat_template_kwargs": {"enable_thinking": True}}, False, ["kwargs"]),
        (
            {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"},
            True,
            ["effort"],
        ),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False, []),
        ({"reasoning_effort": "none"}, False, []),
        ({"reasoning_effort": "low"}, True, []),
        ({"reasoning_effort": "high"}, True, []),
    ],
    ids=[
        "LOC-CHAT-32",
        "LOC-CHAT-29",
        "LOC-CHAT-29-over-kwargs",
        "LOC-CHAT-30-over-effort",
        "LOC-CHAT-30",
        "LOC-CHAT-31",
        "REQ-003-open-17-low",
        "REQ-003-open-17-high",
    ],
)
def test_the_most_specific_field_decides_the_prompt(
    client: TestClient, extra: dict[str, Any], thinking: bool, unused: list[str]
) -> None:
    """LOC-CHAT-29..32: think, then chat_template_kwargs.enable_thinking, then
    reasoning_effort ("none" alone is off), then the server's default (off): the template
    opens a span (on) or writes an empty one (off). A field a more specific one overrode had
    no effect and is reported."""
    payload = {"model": QWEN3, "messages": HI, "temperature": 0}
    on = prompt_tokens(client, {**payload, "think": True})
    off = prompt_tokens(client, {**payload, "think": False})
    assert off > on  # "<think>\n\n</think>\n\n" against "<think>\n"
    response = post(client, {**payload, **extra, "max_tokens": 1})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == (on if thinking else off)
    names = {"kwargs": '"chat_template_kwargs.enable_thinking"', "effort": '"reasoning_effort"'}
    assert ignored(response) == ", ".join(names[u] for u in unused)


def test_the_think_parameter_is_the_default(bare: TestClient) -> None:
    """LOC-CHAT-32, LOC-CONC-07: with the config's `think` on, a request that says nothing
    thinks, on the next message, with no reload; a request's own `think: false` still wins."""
    payload = {"model": QWEN3, "messages": HI, "temperature": 0}
    on = prompt_tokens(bare, {**payload, "think": True})
    off = prompt_tokens(bare, {**payload, "think": False})
    assert prompt_tokens(bare, payload) == off
    response = bare.put("/api/config", json={"values": {"think": True}}, headers=JSON)
    assert response.status_code == 200 and response.json()["rejected"] == {}
    assert prompt_tokens(bare, payload) == on
    assert prompt_tokens(bare, {**payload, "think": False}) == off
    assert prompt_tokens(bare, {**payload, "reasoning_effort": "none"}) == off


def test_gguf_honours_think_but_not_the_template_kwargs(client: TestClient) -> None:
    """LOC-CHAT-29..32 on GGUF, OAI-GGUF-10, OAI-TOKIDS-01: `think` and `reasoning_effort`
    decide thinking on llama.cpp too (its template gets `enable_thinking` as transformers'
    does); chat_template_kwargs, enable_thinking included, stays dropped and reported, and an
    overridden field is reported as on transformers."""
    payload = {"model": GGUF_ID, "messages": HI, "max_tokens": 6, "temperature": 0}
    reply(client, payload)  # warm the prompt: a cold and a warm prefill may differ
    plain = reply(client, payload)
    asked = {
        "think": True,
        "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    response = post(client, {**payload, **asked})
    assert response.status_code == 200, response.text
    assert ignored(response) == '"chat_template_kwargs", "reasoning_effort"'
    # SmolLM2's own template reads no enable_thinking: the same prompt either way
    assert response.json()["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    strict = post(client, {**payload, "think": False}, **{"X-miLLM-Strict": "true"})
    assert strict.status_code == 200 and ignored(strict) == ""


def test_the_llama_cpp_template_renders_enable_thinking_as_transformers_does(
    client: TestClient,
) -> None:
    """OAI-TOKIDS-01, LOC-CHAT-36: llama.cpp's template renderer takes `enable_thinking`
    exactly as transformers' `apply_chat_template` does: the Qwen3-style template renders
    the same text on both engines, thinking on and off."""
    from miserver.engines.base import ChatPrompt
    from miserver.engines.llamacpp import chat as llama_chat

    source = (TEMPLATES / "qwen3.jinja").read_text("utf-8")
    reply(client, {"model": QWEN3, "messages": HI, "max_tokens": 1})  # QWEN3 resident
    engine = client.app.state.manager.resident.engine  # type: ignore[attr-defined]
    tokens = {"bos_token": "", "eos_token": "<|im_end|>"}
    template = llama_chat.ChatTemplate(source, tokens, None)
    for enabled in (True, False):
        prompt = ChatPrompt(tuple(HI), {"enable_thinking": enabled})
        on_llama = llama_chat.render_text(template, prompt)
        on_transformers = engine.tokenizer.apply_chat_template(
            list(HI), tokenize=False, add_generation_prompt=True, enable_thinking=enabled
        )
        assert on_llama == on_transformers
        assert on_llama.endswith("<think>\n" if enabled else "<think>\n\n</think>\n\n")


# -- reasoning spans in replies -----------------------------------------------------------


def test_the_reply_splits_into_reasoning_and_answer(client: TestClient) -> None:
    """LOC-CHAT-68, LOC-CHAT-57, LOC-CHAT-10: the model reasons in the span its prompt opened,
    closes it and answers; the span is reasoning_content, the answer content, streamed or
    not, no marker in either; reasoning_effort turns the same thinking on."""
    whole = reply(client, ask(think=True))
    [choice] = whole["choices"]
    said = choice["message"]
    assert choice["finish_reason"] == "stop"
    assert said["reasoning_content"] and said["content"]
    assert not any(m in said["reasoning_content"] + said["content"] for m in MARKERS)
    parts, finish = deltas(client, ask(think=True))
    assert finish == "stop"
    assert joined(parts, "reasoning_content") == said["reasoning_content"]
    assert joined(parts, "content") == said["content"]
    answering = next(i for i, d in enumerate(parts) if d.get("content"))
    assert not any(d.get("reasoning_content") for d in parts[answering:])  # reasoning first
    assert message(client, ask(reasoning_effort="medium")) == said


def test_history_reasoning_reaches_the_template(client: TestClient) -> None:
    """LOC-CHAT-10: assistant messages' reasoning_content is rendered (a longer prompt) and is
    not reported as unused, on either engine."""
    with_reasoning = post(client, ask(max_tokens=1))
    without = reply(client, ask(max_tokens=1, messages=capitals(reasoning=False)))
    assert with_reasoning.status_code == 200 and ignored(with_reasoning) == ""
    assert with_reasoning.json()["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]
    gguf = post(client, ask(model=GGUF_ID, max_tokens=1))
    assert gguf.status_code == 200 and "reasoning_content" not in ignored(gguf)


def test_a_budget_spent_inside_the_span(client: TestClient) -> None:
    """LOC-CHAT-68: a reply cut while reasoning is all reasoning; the answer is empty."""
    said = message(client, ask(think=True, max_tokens=5))
    assert said["reasoning_content"] and said["content"] == ""
    parts, finish = deltas(client, ask(think=True, max_tokens=5))
    assert finish == "length"
    assert joined(parts, "reasoning_content") == said["reasoning_content"]
    assert joined(parts, "content") == ""


def test_thinking_off_leaves_the_reply_as_content(client: TestClient) -> None:
    """LOC-CHAT-68: with an empty span in the prompt the reply opens none: all content."""
    said = message(client, ask(think=False, max_tokens=12))
    assert said["reasoning_content"] is None and said["content"]


def test_nothing_found_is_returned_raw(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """LOC-CHAT-41: a one-token reply of blank reasoning holds no answer, reasoning or call:
    its raw text is content and a warning is logged, streamed or not."""
    payload = {"model": QWEN3, "messages": HI, "max_tokens": 1, "temperature": 0, "think": True}
    with caplog.at_level(logging.WARNING, "miserver.serving.chat.replies"):
        said = message(client, payload)
    assert said["content"] and not said["content"].strip()  # the model's blank first token
    assert said["reasoning_content"] is None
    assert "returned raw as content" in caplog.text
    parts, _ = deltas(client, payload)
    assert joined(parts, "content") == said["content"]
    assert joined(parts, "reasoning_content") == ""


def test_a_span_before_a_call_is_reasoning(client: TestClient) -> None:
    """LOC-CHAT-38, -60, -63, -68, -69: the model reasons, then calls: the span is reasoning,
    the call is a tool call, nothing is content, streamed or not."""
    payload = ask(messages=weather_calls(), tools=WEATHER, think=True)
    [choice] = reply(client, payload)["choices"]
    assert choice["finish_reason"] == "tool_calls"
    said = choice["message"]
    assert said["content"] is None and said["reasoning_content"]
    [call] = said["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    parts, finish = deltas(client, payload)
    assert finish == "tool_calls"
    assert joined(parts, "reasoning_content") == said["reasoning_content"]
    assert joined(parts, "content") == ""
    assert [i for i, d in enumerate(parts) if "tool_calls" in d] == [len(parts) - 1]


@pytest.mark.parametrize(
    ("extra", "unused"),
    [
        ({"response_format": {"type": "json_object"}, "think": True}, "think"),
        (
            {
                "response_format": {"type": "json_object"},
                "chat_template_kwargs": {"enable_thinking": True},
            },
            "chat_template_kwargs.enable_thinking",
        ),
        (
            {
                "tools": WEATHER,
                "tool_choice": "required",
                "reasoning_effort": "high",
                "max_tokens": 40,
            },
            "reasoning_effort",
        ),
    ],
    ids=["LOC-CHAT-40-json", "LOC-CHAT-40-kwargs", "LOC-CHAT-40-forced-call"],
)
def test_a_constrained_reply_is_rendered_thinking_off(
    client: TestClient, extra: dict[str, Any], unused: str
) -> None:
    """LOC-CHAT-40: reasoning is never constrained: a reply held to a grammar from its first
    token is rendered with thinking off, the field that asked for thinking is reported (and
    refused in strict mode), and the reply is the constrained document or call."""
    payload = {"model": QWEN3, "messages": HI, "max_tokens": 20, "temperature": 0, **extra}
    response = post(client, payload)
    assert response.status_code == 200, response.text
    assert ignored(response) == f'"{unused}"'
    [choice] = response.json()["choices"]
    assert "reasoning_content" not in choice["message"]
    if "response_format" in extra:
        assert isinstance(json.loads(choice["message"]["content"]), dict)
        off = prompt_tokens(client, {"model": QWEN3, "messages": HI, "think": False})
        assert response.json()["usage"]["prompt_tokens"] == off
    else:
        assert choice["finish_reason"] == "tool_calls"
    strict = post(client, payload, **{"X-miLLM-Strict": "true"})
    assert strict.status_code == 400
    assert strict.json()["error"]["param"] == unused


def as_blocks(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as Anthropic's: an assistant's reasoning as a thinking block."""
    if message["role"] != "assistant":
        return message
    thought = {"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}
    return {"role": "assistant", "content": [thought, {"type": "text", "text": message["content"]}]}


def test_a_thinking_budget_closes_the_span(client: TestClient) -> None:
    """Issue 45 item 1 (`thinking.budget_tokens` on /v1/messages): the reply reasons for at
    most the budget's tokens, then its span is closed for it and it answers; the thinking
    block is the unbudgeted one's first tokens, and the budget is not reported unused."""
    engine = client.app.state.manager  # type: ignore[attr-defined]
    history = [as_blocks(m) for m in capitals()]
    body = {"model": QWEN3, "max_tokens": 60, "messages": history, "temperature": 0}
    thinking = {"type": "enabled"}
    free = client.post("/v1/messages", json={**body, "thinking": thinking}, headers=JSON)
    budgeted = client.post(
        "/v1/messages", json={**body, "thinking": {**thinking, "budget_tokens": 3}}, headers=JSON
    )
    assert free.status_code == 200 and budgeted.status_code == 200, budgeted.text
    assert ignored(budgeted) == ""
    blocks = {b["type"]: b for b in budgeted.json()["content"]}
    unbounded = {b["type"]: b for b in free.json()["content"]}
    tokenizer = engine.resident.engine
    spent = tokenizer.tokenize(blocks["thinking"]["thinking"], add_special_tokens=False)
    assert 0 < len(spent) <= 3
    assert len(tokenizer.tokenize(unbounded["thinking"]["thinking"], add_special_tokens=False)) > 3
    assert unbounded["thinking"]["thinking"].startswith(blocks["thinking"]["thinking"])
    assert blocks["text"]["text"] and "</think>" not in blocks["text"]["text"]
