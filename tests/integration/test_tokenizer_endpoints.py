"""vLLM's tokenizer endpoints (issue 42): POST /tokenize, POST /detokenize and
GET /tokenizer_info, at the root and under /v1, over real HTTP on loopback.

One server per engine (`engine_server`: SmolLM2 on transformers, its Q4_1 GGUF
on llama.cpp), each started with nothing loaded: the first request names the
model, which loads it as /v1 does. Answers are compared with the served
engine's own tokenizer, and a chat's ids with what a real chat completion of
the same messages counts (OAI-TOKIDS-01). A keyed server with nothing loaded
checks the security model (REQ-003 LOC-SEC-05/06/18) and `503 no_model`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from miserver.engines.base import ChatPrompt, Engine
from tests.conftest import ENGINE_THREADS, GGUF_ID, MODEL_ID
from tests.errors import error_of
from tests.servers import KEY, Running, serving, settings_in

pytestmark = pytest.mark.model

TEXT = "The lighthouse keeper waved, twice."
USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module", params=[MODEL_ID, GGUF_ID], ids=["transformers", "llama.cpp"])
def engine_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """A server with nothing loaded, then `model` loaded by a tokenize naming it: tokenizing a
    model that is not loaded loads it, as /v1 does."""
    model = request.param
    folder = tmp_path_factory.mktemp("tokenizer")
    with serving(settings_in(folder, model=model, threads=ENGINE_THREADS)) as running:
        assert running.app.state.manager.resident is None
        with running.client() as client:
            answer = client.post("/tokenize", json={"model": model, "prompt": "Hi"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-miLLM-Model"] == model
        yield running


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Loopback with a key; nothing is ever loaded."""
    folder = tmp_path_factory.mktemp("tokenizer-keyed")
    with serving(settings_in(folder, api_key=KEY)) as running:
        yield running


def model_of(server: Running) -> str:
    resident = server.app.state.manager.resident
    assert resident is not None
    return str(resident.entry.model_id)


def engine_of(server: Running) -> Engine:
    resident = server.app.state.manager.resident
    assert resident is not None
    return resident.engine  # type: ignore[no-any-return]


def post(server: Running, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    with server.client(**headers) as client:
        return client.post(path, json=body)


def tokens(server: Running, body: dict[str, Any], path: str = "/tokenize") -> dict[str, Any]:
    """The 200 body of a tokenize naming the server's model, checked whole."""
    answer = post(server, path, {"model": model_of(server), **body})
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert set(found) == {"count", "max_model_len", "tokens", "token_strs"}
    assert found["count"] == len(found["tokens"])
    assert found["max_model_len"] == engine_of(server).facts.context_length
    return found


def chat_prompt_tokens(server: Running, body: dict[str, Any]) -> int:
    """`usage.prompt_tokens` of a real one-token chat completion."""
    chat = {"model": model_of(server), "max_tokens": 1, "temperature": 0, **body}
    answer = post(server, "/v1/chat/completions", chat)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens"])


# -- tokenize ---------------------------------------------------------------------------


@pytest.mark.parametrize("special", [None, True, False])
def test_a_text_prompt_is_the_engines_own_tokens(engine_server: Running, special: Any) -> None:
    """OAI-TOKIDS-06: `prompt` is tokenized as the engine tokenizes it, `add_special_tokens`
    default true; special-token text becomes the special token. `token_strs` is null unless
    asked for, then each id's own text."""
    engine = engine_of(engine_server)
    text = "<|im_start|>" + TEXT
    body: dict[str, Any] = {"prompt": text}
    if special is not None:
        body["add_special_tokens"] = special
    found = tokens(engine_server, body)
    assert found["tokens"] == engine.tokenize(text, add_special_tokens=special is not False)
    assert found["token_strs"] is None
    strs = tokens(engine_server, {**body, "return_token_strs": True})["token_strs"]
    assert strs == [engine.decode([i], keep_special=True) for i in found["tokens"]]
    assert "".join(strs).endswith(TEXT)


def test_messages_are_tokenized_as_a_chat_completion_renders_them(engine_server: Running) -> None:
    """OAI-TOKIDS-01: a chat's ids are the engine's render of it, and as many as a chat
    completion of the same messages counts; with tools shown too, and with a trailing
    assistant message continued (OAI-CONT-01)."""
    engine = engine_of(engine_server)
    found = tokens(engine_server, {"messages": USER})
    assert found["tokens"] == engine.render_chat(ChatPrompt(USER))
    assert found["count"] == chat_prompt_tokens(engine_server, {"messages": USER})
    with_tools = tokens(engine_server, {"messages": USER, "tools": [WEATHER]})
    assert with_tools["count"] > found["count"]
    assert with_tools["count"] == chat_prompt_tokens(
        engine_server, {"messages": USER, "tools": [WEATHER]}
    )
    partial = [*USER, {"role": "assistant", "content": "Hello! The"}]
    flags = {"add_generation_prompt": False, "continue_final_message": True}
    continued = tokens(engine_server, {"messages": partial, **flags})
    assert continued["tokens"] == engine.render_chat(ChatPrompt(partial))
    assert continued["count"] == chat_prompt_tokens(engine_server, {"messages": partial})


def test_the_root_paths_are_the_v1_operations(engine_server: Running) -> None:
    """vLLM's root paths and their /v1 paths answer the same."""
    body = {"messages": USER, "return_token_strs": True}
    assert tokens(engine_server, body) == tokens(engine_server, body, "/v1/tokenize")
    model = model_of(engine_server)
    for path in ("/detokenize", "/v1/detokenize"):
        answer = post(engine_server, path, {"model": model, "tokens": [1, 2]})
        assert answer.status_code == 200, (path, answer.text)
    with engine_server.client() as client:
        root, v1 = client.get("/tokenizer_info"), client.get("/v1/tokenizer_info")
    assert root.status_code == v1.status_code == 200
    assert root.json() == v1.json()


def test_fields_the_form_does_not_use_are_reported(engine_server: Running) -> None:
    """OAI-VALID-07/10: a chat field sent with `prompt`, or an undeclared one, is reported
    in X-miLLM-Ignored-Fields, and refused in strict mode; with no `model`, the loaded
    model answers."""
    body = {"prompt": "Hi", "tools": [WEATHER], "colour": "blue"}
    answer = post(engine_server, "/tokenize", body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-miLLM-Model"] == model_of(engine_server)
    assert answer.headers["X-miLLM-Ignored-Fields"] == '"tools", "colour"'
    strict = post(engine_server, "/tokenize", body, **{"X-miLLM-Strict": "true"})
    error_of(strict, 400, "unused_fields_refused", "tools")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({}, "invalid_parameter", "prompt"),
        ({"prompt": "Hi", "messages": USER}, "invalid_parameter", "messages"),
        (
            {"messages": USER, "add_generation_prompt": False},
            "field_not_honoured",
            "add_generation_prompt",
        ),
        (
            {"messages": USER, "add_special_tokens": True},
            "field_not_honoured",
            "add_special_tokens",
        ),
        (
            {"messages": USER, "continue_final_message": True},
            "invalid_parameter",
            "continue_final_message",
        ),
        (
            {"messages": [*USER, {"role": "assistant", "content": "A"}]},
            "invalid_parameter",
            "continue_final_message",
        ),
        (
            {"messages": USER, "add_generation_prompt": True, "continue_final_message": True},
            "invalid_parameter",
            "continue_final_message",
        ),
        ({"prompt": "Hi", "chat_template": "{{ x }}"}, "field_not_honoured", "chat_template"),
        ({"prompt": 7}, "invalid_parameter", "prompt"),
        ({"messages": [{"role": "robot"}]}, "invalid_request", "messages[0].role"),
    ],
)
def test_a_bad_tokenize_is_a_400_naming_the_field(
    engine_server: Running, body: dict[str, Any], code: str, param: str
) -> None:
    """OAI-ERR-01: a bad body is a 400 in OpenAI's error shape naming the field: neither or
    both of `prompt` and `messages`, a turn flag a chat completion does not render."""
    answer = post(engine_server, "/tokenize", {"model": model_of(engine_server), **body})
    error_of(answer, 400, code, param)


def test_an_unknown_model_is_404(engine_server: Running) -> None:
    """OAI-ERR-03."""
    answer = post(engine_server, "/tokenize", {"model": "no-such-model", "prompt": "Hi"})
    error_of(answer, 404, "model_not_found", "model")


# -- detokenize ---------------------------------------------------------------------------


def test_detokenize_takes_tokenize_back(engine_server: Running) -> None:
    """The ids of a text decode to the text; special tokens are kept as their text."""
    ids = tokens(engine_server, {"prompt": TEXT})["tokens"]
    special = tokens(engine_server, {"prompt": "<|im_start|>"})["tokens"]
    model = model_of(engine_server)
    answer = post(engine_server, "/detokenize", {"model": model, "tokens": special + ids})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"prompt": "<|im_start|>" + TEXT}
    empty = post(engine_server, "/detokenize", {"model": model, "tokens": []})
    assert empty.json() == {"prompt": ""}


@pytest.mark.parametrize("bad", [-1, "vocab"])
def test_an_id_outside_the_vocabulary_is_a_400_naming_it(
    engine_server: Running, bad: int | str
) -> None:
    """An id that is negative or not below the vocabulary size is refused, `tokens[i]`."""
    size = engine_of(engine_server).facts.vocab_size
    ids = [5, 6, size if bad == "vocab" else bad]
    answer = post(engine_server, "/detokenize", {"model": model_of(engine_server), "tokens": ids})
    error = error_of(answer, 400, "invalid_parameter", "tokens[2]")
    assert error["type"] == "invalid_request_error"


# -- tokenizer_info ---------------------------------------------------------------------


def test_tokenizer_info_says_what_the_engine_knows(engine_server: Running) -> None:
    """The engine's tokenizer, window, vocabulary, special tokens and chat template."""
    engine = engine_of(engine_server)
    model = model_of(engine_server)
    with engine_server.client() as client:
        answer = client.get("/tokenizer_info", params={"model": model})
    assert answer.status_code == 200, answer.text
    info = answer.json()
    window = engine.facts.context_length
    assert info["model"] == model
    assert info["model_max_length"] == info["max_model_len"] == window
    assert info["vocab_size"] == engine.facts.vocab_size == 49152
    assert info["chat_template"] == engine.chat_template is not None
    assert (info["bos_token"], info["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    expected = "gpt2" if model == GGUF_ID else type(engine.tokenizer).__name__  # type: ignore[attr-defined]
    assert info["tokenizer_class"] == expected


# -- the security model -----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize", "/detokenize"])
def test_the_root_paths_need_the_key_as_v1_does(keyed: Running, path: str) -> None:
    """LOC-SEC-05/06: with a key, no key or a wrong one is 401 with WWW-Authenticate, at the
    root as under /v1; the right key passes (here to `503 no_model`: nothing is loaded)."""
    body = {"prompt": "Hi"} if "detok" not in path else {"tokens": [1]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = post(keyed, path, body, **headers)
        error_of(answer, 401, "invalid_api_key", "Authorization")
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    with keyed.client(Authorization=f"Bearer {KEY}") as client:
        error_of(client.get("/tokenizer_info"), 503, "no_model", "model")
        error_of(client.get("/v1/tokenizer_info"), 503, "no_model", "model")
        error_of(
            client.get("/tokenizer_info", params={"model": "x"}), 404, "model_not_found", "model"
        )
    error_of(post(keyed, path, body, Authorization=f"Bearer {KEY}"), 503, "no_model", "model")


def test_the_root_paths_refuse_a_foreign_origin_and_other_media(keyed: Running) -> None:
    """LOC-SEC-18, LOC-SEC-25: the Origin and media-type checks hold at the root too."""
    auth = {"Authorization": f"Bearer {KEY}"}
    answer = post(keyed, "/tokenize", {"prompt": "Hi"}, Origin="http://evil.example", **auth)
    error_of(answer, 403, "forbidden_origin", "Origin")
    with keyed.client(**auth) as client:
        form = client.post(
            "/tokenize", content=b"prompt=Hi", headers={"Content-Type": "text/plain"}
        )
    error_of(form, 415, "unsupported_media_type", "Content-Type")
