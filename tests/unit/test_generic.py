"""The generic call format (serving/chat/generic.py): prompt, history, schema, reader, stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from miserver.engines.base import ChatPrompt
from miserver.errors import InvalidParameter
from miserver.serving.chat import generic
from miserver.serving.chat.call_formats import ParsedReply, ToolCall
from miserver.serving.chat.generic import GENERIC, DocumentBuffer, content_so_far
from miserver.serving.chat.tools import shown, tool_ask, tool_plan
from tests.models import converted_default

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather", "parameters": CITY},
}
TIME = {"type": "function", "function": {"name": "get_time"}}
OFFERED = frozenset({"get_weather", "get_time"})
PARIS = ToolCall("get_weather", '{"city": "Paris"}')
CALL_DOC = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def history() -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    return [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {**call, "function": {**call["function"], "arguments": '{"city": "Paris"}'}},
                {
                    "id": "call_2",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]},
        {"role": "assistant", "content": "Paris 18 C, Rome 25 C."},
        {"role": "user", "content": "Thanks. And Oslo?"},
    ]


# -- the prompt


def test_tools_go_into_a_new_system_turn() -> None:
    """OAI-TOOLS-02 (generic): the tools, one JSON line each, and how to answer, as the first
    (system) turn when the chat has none."""
    plan = tool_plan(tool_ask([WEATHER, TIME], parallel_tool_calls=True), PLAIN_TEMPLATE)
    assert plan is not None and plan.format.name == "generic" and plan.opening == ""
    prompt = plan.prompt(ChatPrompt(({"role": "user", "content": "hi"},)))
    system, user = prompt.messages
    assert system["role"] == "system" and user == {"role": "user", "content": "hi"}
    heading, *tools, answer = system["content"].split("\n")
    assert heading == generic.wording().tools
    assert [json.loads(t) for t in tools] == [WEATHER["function"], TIME["function"]]
    assert '{"tool_calls": ' in answer and '{"content": ' in answer
    assert "one or more tools" in answer
    assert prompt.tools == () and prompt.opening == ""  # the template never sees them


@pytest.mark.parametrize("role", ["system", "developer"])
def test_tools_are_merged_after_the_system_message(role: str) -> None:
    """OAI-TOOLS-02 (generic): an existing system (or developer) message keeps its text first."""
    plan = tool_plan(tool_ask([WEATHER]), None)
    assert plan is not None
    chat = ChatPrompt(({"role": role, "content": "Be brief."}, {"role": "user", "content": "hi"}))
    first, user = plan.prompt(chat).messages
    assert first["role"] == role and first["content"].startswith("Be brief.\n\nYou can call")
    assert user == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("body", "words", "absent"),
    [
        (
            {"tool_choice": "required", "parallel_tool_calls": True},
            "that calls one or more tools",
            '{"content"',
        ),
        ({"tool_choice": "required"}, "that calls one tool", '{"content"'),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            'calls get_weather: {"tool_calls": [{"name": "get_weather"',
            '{"content"',
        ),
        ({"parallel_tool_calls": False}, "to call one tool,", "one or more"),
    ],
    ids=["OAI-TOOLS-14-parallel", "OAI-TOOLS-14", "OAI-TOOLS-15", "OAI-TOOLS-17"],
)
def test_the_answer_line_follows_tool_choice(body: dict[str, Any], words: str, absent: str) -> None:
    """OAI-TOOLS-14, -15, -17 (generic): the instructions name what the grammar allows."""
    plan = tool_plan(tool_ask([WEATHER], **body), None)
    assert plan is not None
    answer = plan.prompt(ChatPrompt(({"role": "user", "content": "hi"},))).messages[0]["content"]
    assert words in answer and absent not in answer.splitlines()[-1]


# -- the history


def test_history_becomes_documents_when_the_tools_are_shown() -> None:
    """OAI-TOOLS-18, -19 (generic): calls (arguments a JSON string or an object) are a calls
    document; consecutive results one user turn, named by their call's id; an earlier answer
    is a content document; the last message is left as it is."""
    plan = tool_plan(tool_ask([WEATHER]), None)
    assert plan is not None
    messages = plan.prompt(ChatPrompt(tuple(history()))).messages[1:]
    calls = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ]
    results = [
        {"name": "get_weather", "content": "25 C"},
        {"name": "get_weather", "content": "18 C"},
    ]
    assert [dict(m) for m in messages] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": json.dumps({"tool_calls": calls})},
        {"role": "user", "content": json.dumps({"tool_results": results})},
        {"role": "assistant", "content": json.dumps({"content": "Paris 18 C, Rome 25 C."})},
        {"role": "user", "content": "Thanks. And Oslo?"},
    ]


def test_history_without_tools_keeps_plain_answers() -> None:
    """OAI-TOOLS-18, -19 (generic, no tools shown): calls and results still become plain
    turns, where the engine honours tools; answers stay text; other templates are untouched."""
    chat = ChatPrompt(tuple(history()))
    messages = shown(None, chat, PLAIN_TEMPLATE, True).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert json.loads(messages[1]["content"])["tool_calls"][1]["arguments"] == {"city": "Rome"}
    assert messages[3]["content"] == "Paris 18 C, Rome 25 C."
    assert shown(None, chat, PLAIN_TEMPLATE, False) is chat  # the engine takes no tools
    hermes = "{% if tools %}<tool_call>{% endif %}{{ messages }}"
    assert shown(None, chat, hermes, True) is chat  # the template renders its own history


def test_a_call_with_text_and_a_function_message() -> None:
    """OAI-TOOLS-18, -19, OAI-CHAT-04: an assistant's text comes before its calls document;
    a legacy `function` message is a result under its own name; unparsable arguments stay a
    string."""
    call = {"id": "x", "function": {"name": "get_time", "arguments": "not json"}}
    messages = generic.plain_history(
        [
            {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
            {"role": "function", "name": "get_time", "content": "noon"},
        ],
        documents=False,
    )
    document = {"tool_calls": [{"name": "get_time", "arguments": "not json"}]}
    assert messages == [
        {"role": "assistant", "content": "Checking.\n" + json.dumps(document)},
        {"role": "user", "content": '{"tool_results": [{"name": "get_time", "content": "noon"}]}'},
    ]


# -- the schema


def validator(body: dict[str, Any]) -> Draft202012Validator:
    plan = tool_plan(tool_ask([WEATHER, TIME], **body), None)
    assert plan is not None and plan.constraint is not None
    assert plan.constraint.kind == "json_schema"
    return Draft202012Validator(json.loads(plan.constraint.text))


PARIS_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
NOON_CALL = {"name": "get_time", "arguments": {}}


@pytest.mark.parametrize(
    ("body", "valid", "invalid"),
    [
        (
            {"parallel_tool_calls": True},
            [{"content": "hi"}, {"tool_calls": [PARIS_CALL, NOON_CALL]}],
            [
                {"tool_calls": [{"name": "get_weather", "arguments": {"city": "P", "unit": "C"}}]},
                {"tool_calls": []},
                {"tool_calls": [{"name": "get_weather", "arguments": {}}]},
                {"tool_calls": [{"name": "delete_all", "arguments": {}}]},
                {"content": "hi", "tool_calls": [PARIS_CALL]},
                {"answer": "hi"},
            ],
        ),
        ({"tool_choice": "required"}, [{"tool_calls": [NOON_CALL]}], [{"content": "hi"}]),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            [{"tool_calls": [NOON_CALL]}],
            [{"tool_calls": [PARIS_CALL]}, {"content": "hi"}],
        ),
        (
            {"parallel_tool_calls": False},
            [{"tool_calls": [PARIS_CALL]}, {"content": "hi"}],
            [{"tool_calls": [PARIS_CALL, NOON_CALL]}],
        ),
        (
            {},
            [{"tool_calls": [PARIS_CALL]}, {"content": "hi"}],
            [{"tool_calls": [PARIS_CALL, NOON_CALL]}, {"tool_calls": [PARIS_CALL, PARIS_CALL]}],
        ),
    ],
    ids=[
        "OAI-TOOLS-12-auto-parallel",
        "OAI-TOOLS-14",
        "OAI-TOOLS-15",
        "OAI-TOOLS-17",
        "OAI-TOOLS-17-generic-default",
    ],
)
def test_schema_allows_what_tool_choice_allows(
    body: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    """OAI-TOOLS-12, -14, -15, -17 (generic): auto is calls or content; required only calls;
    a named choice only that function; parallel_tool_calls false at most one call; each
    function's arguments under its own parameters schema, with no key it does not declare;
    without `parallel_tool_calls: true` one call (llama.cpp's server's default, issue 15)."""
    check = validator(body)
    assert all(check.is_valid(document) for document in valid)
    assert not any(check.is_valid(document) for document in invalid)


def test_schema_keeps_each_functions_defs() -> None:
    """OAI-TOOLS-15 (generic): `$defs` and local `$ref`s of two functions do not collide."""
    a = {
        "$defs": {"v": {"type": "string"}},
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/v"}},
    }
    b = {
        "$defs": {"v": {"type": "integer"}},
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/v"}},
    }
    tools = [
        {"type": "function", "function": {"name": n, "parameters": p}}
        for n, p in [("a", a), ("b", b)]
    ]
    plan = tool_plan(tool_ask(tools, "required"), None)
    assert plan is not None and plan.constraint is not None
    check = Draft202012Validator(json.loads(plan.constraint.text))
    assert check.is_valid({"tool_calls": [{"name": "a", "arguments": {"x": "s"}}]})
    assert check.is_valid({"tool_calls": [{"name": "b", "arguments": {"x": 1}}]})
    assert not check.is_valid({"tool_calls": [{"name": "a", "arguments": {"x": 1}}]})
    assert not check.is_valid({"tool_calls": [{"name": "b", "arguments": {"x": "s"}}]})


def test_loosened_schema_takes_any_object_then_none() -> None:
    """OAI-TOOLS-15 (generic): when the engine refuses the schema, arguments are any object;
    refused again, nothing is constrained."""
    plan = tool_plan(tool_ask([WEATHER]), None)
    assert plan is not None
    loose = plan.loosened()
    assert loose.constraint is not None and loose.constraint != plan.constraint
    check = Draft202012Validator(json.loads(loose.constraint.text))
    assert check.is_valid({"tool_calls": [{"name": "get_weather", "arguments": {"y": 1}}]})
    assert loose.loosened().constraint is None


@pytest.mark.model
def test_the_grammar_compiles_and_holds_the_model_to_a_document() -> None:
    """OAI-TOOLS-12, -14 (generic): llguidance, as the engines use it, compiles the schema over
    SmolLM2's tokenizer; it accepts a calls document and refuses an unoffered name."""
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted_default())
    ll = llguidance.hf.from_tokenizer(tokenizer, eos_token=[tokenizer.eos_token_id])
    plan = tool_plan(tool_ask([WEATHER, TIME], "required"), None)
    assert plan is not None and plan.constraint is not None
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.loads(plan.constraint.text),
        overrides=options,  # type: ignore[arg-type]
    )

    def accepted(text: str) -> bool:
        matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        ids = tokenizer.encode(text, add_special_tokens=False)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    assert accepted(CALL_DOC)
    assert not accepted(CALL_DOC.replace("get_weather", "get_wetter"))
    assert not accepted('{"content": "hi"}')


# -- the reader


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (CALL_DOC, ParsedReply(None, (PARIS,))),
        (
            '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_time", "arguments": {}}]}',
            ParsedReply(None, (PARIS, ToolCall("get_time", "{}"))),
        ),
        (' \n{"content": "It is 18 C."}\n', ParsedReply("It is 18 C.", ())),
        ('{"content": ""}', ParsedReply("", ())),
        ('{"content": "Caf\\u00e9 \\"Zur\\" \\ud83d\\ude00"}', ParsedReply('Café "Zur" 😀', ())),
        ('{"content": "It is 18', ParsedReply("It is 18", ())),  # cut by max_tokens
        ('{"content": "a\\u00', ParsedReply("a", ())),
    ],
    ids=["call", "two-calls", "content", "empty", "escapes", "cut", "cut-escape"],
)
def test_documents_are_read(reply: str, expected: ParsedReply) -> None:
    """OAI-TOOLS-03, -04 (generic): a calls document is calls; a content document (whole or cut
    short) is its text, never the JSON around it."""
    assert GENERIC.parse(reply, OFFERED, None) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "It is sunny.",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par',
        '{"tool_calls": []}',
        '{"tool_calls": [{"name": "delete_all", "arguments": {}}]}',
        '{"tool_calls": [{"name": "get_weather", "arguments": ["Paris"]}]}',
        '{"tool_calls": ["get_weather"]}',
        '{"tool_calls": [{"name": "get_time"}], "content": "x"}',
        '{"answer": 42}',
        '["content"]',
    ],
    ids=[
        "text",
        "cut-call",
        "no-calls",
        "unknown-function",
        "arguments-list",
        "call-not-object",
        "both",
        "other-object",
        "not-object",
    ],
)
def test_replies_that_are_no_document_are_content(reply: str) -> None:
    """OAI-TOOLS-21 (generic): anything but a calls or content document is plain content."""
    assert GENERIC.parse(reply, OFFERED, None) is None


def test_limit_keeps_the_first_call() -> None:
    """OAI-TOOLS-17 (generic): limit 1 keeps the first call."""
    reply = (
        '{"tool_calls": [{"name": "get_time", "arguments": {}}, '
        '{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    )
    assert GENERIC.parse(reply, OFFERED, 1) == ParsedReply(None, (ToolCall("get_time", "{}"),))


# -- the stream


def pushed(buffer: DocumentBuffer, parts: list[str]) -> list[str]:
    return [buffer.push(p) for p in parts]


def test_stream_sends_content_as_it_is_decoded() -> None:
    """OAI-TOOLS-05 (generic): a content document's text goes out as it decodes, escapes
    whole; no JSON is sent."""
    buffer = DocumentBuffer()
    parts = ['{"con', 'tent": "He', "llo \\", "n w\\u00", 'e9!"', "}"]
    assert pushed(buffer, parts) == ["", "He", "llo ", "\n w", "é!", ""]
    assert buffer.rest() == ""


def test_stream_holds_a_calls_document() -> None:
    """OAI-TOOLS-06 (generic): a calls document is held whole; unparsed, it is released raw."""
    buffer = DocumentBuffer()
    assert pushed(buffer, ['{"tool', '_calls": [', '{"name": "x"']) == ["", "", ""]
    assert buffer.text == '{"tool_calls": [{"name": "x"'
    assert buffer.rest() == buffer.text


def test_stream_rest_of_a_cut_content_document() -> None:
    """OAI-TOOLS-21 (generic): what was held of a content document is sent decoded at the end."""
    buffer = DocumentBuffer()
    assert pushed(buffer, ['{"content": "a\\']) == ["a"]
    assert buffer.rest() == ""
    assert content_so_far('{"content": "a\\"') == 'a"'


# -- a partial answer (OAI-CONT-01)


PARTIAL_TEXT = {"role": "assistant", "content": "Maximum steps reached. Respond with text only."}


@pytest.mark.parametrize(
    ("partial", "plain"),
    [
        (PARTIAL_TEXT, True),
        ({"role": "assistant", "content": [{"type": "text", "text": " So far: "}]}, True),
        ({"role": "assistant", "content": ' {"content": "It is'}, False),  # a document begun
        ({"role": "assistant", "content": ""}, False),
        ({"role": "user", "content": "Weather in Paris?"}, False),  # no partial at all
    ],
    ids=["text", "text-parts", "document", "empty", "none"],
)
def test_a_partial_begun_as_text_goes_on_as_text(partial: dict[str, Any], plain: bool) -> None:
    """OAI-CONT-01, OAI-CONT-04, OAI-TOOLS-13 (generic): a generic reply is one document from
    the start of the turn, so a partial answer begun as text is continued as a plain chat
    (no tools shown, no document constraint); one begun as a document keeps its plan."""
    chat = ChatPrompt(({"role": "user", "content": "Weather in Paris?"}, partial))
    plan = tool_plan(tool_ask([WEATHER]), PLAIN_TEMPLATE, chat)
    assert (plan is None) is plain
    if plain:
        assert shown(plan, chat, PLAIN_TEMPLATE, honoured=True) == chat


def test_a_forced_call_after_a_text_partial_is_refused() -> None:
    """OAI-CONT-01, OAI-TOOLS-14 (generic): a forced call cannot follow text in one document:
    400 naming tool_choice."""
    chat = ChatPrompt(({"role": "user", "content": "Weather in Paris?"}, PARTIAL_TEXT))
    with pytest.raises(InvalidParameter) as caught:
        tool_plan(tool_ask([WEATHER], tool_choice="required"), None, chat)
    assert caught.value.param == "tool_choice"
