"""Call formats and reply parsers (impl/serving/chat/call_formats.py) on recorded replies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miserver.serving.chat.call_formats import (
    FORMATS,
    CallFormat,
    ParsedReply,
    ToolCall,
    format_of,
    takes_tools,
)
from tests.models import TEMPLATES, converted_default

OFFERED = frozenset({"get_weather", "get_time"})
PARIS = ToolCall("get_weather", '{"city": "Paris"}')
TOKYO = ToolCall("get_weather", '{"city": "Tokyo"}')
TIME = ToolCall("get_time", "{}")

HERMES, LFM2, LLAMA3 = FORMATS["hermes"], FORMATS["lfm2"], FORMATS["llama3"]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_STYLE = (
    "{% if tools %}{% for tool in tools %}<start_function_declaration>{{ tool | tojson }}"
    "<end_function_declaration>{% endfor %}{% endif %}"
    "{% for message in messages %}{% if message.tool_calls %}<start_function_call>"
    "{{ message.tool_calls[0].function.name }}<end_function_call>{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)


def parse(fmt: CallFormat, text: str, limit: int | None = None) -> ParsedReply | None:
    return fmt.parse(text, OFFERED, limit)


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text("utf-8")


# -- hermes (Qwen2.5)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            ParsedReply(None, (PARIS,)),
        ),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>',
            ParsedReply(None, (PARIS, TOKYO)),
        ),
        (
            'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "</tool_call>",
            ParsedReply("Let me check.", (PARIS,)),
        ),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
            "</tool_call>",
            ParsedReply(None, (PARIS,)),
        ),
        (  # stopped at EOS right after the object
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
            ParsedReply(None, (PARIS,)),
        ),
        ('<tool_call>\n{"name": "get_time"}\n</tool_call>', ParsedReply(None, (TIME,))),
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>',
            ParsedReply(None, (ToolCall("get_weather", '{"city": "Zürich"}'),)),
        ),
    ],
    ids=["single", "two", "content-before", "string-arguments", "unclosed", "no-args", "utf8"],
)
def test_hermes_calls(reply: str, expected: ParsedReply) -> None:
    """OAI-TOOLS-09: Hermes/Qwen2.5 `<tool_call>{json}</tool_call>` blocks are calls."""
    assert parse(HERMES, reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "The weather in Paris is sunny.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"t": NaN}}\n</tool_call>',
        '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>',
        '<tool_call>\n["get_weather"]\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {}} and more\n</tool_call>',
        '<tool_call>\n{"name": "get_time"}\n</tool_call>\n<tool_call>\n{"name": ',
    ],
    ids=[
        "no-call",
        "truncated",
        "arguments-list",
        "arguments-string-not-object",
        "nan",
        "unknown-function",
        "name-not-string",
        "call-not-object",
        "text-inside-block",
        "second-call-truncated",
    ],
)
def test_hermes_reply_that_does_not_parse_is_content(reply: str) -> None:
    """OAI-TOOLS-09, OAI-TOOLS-21: no call, a malformed call or an unoffered name: None."""
    assert parse(HERMES, reply) is None


def test_hermes_limit_keeps_the_first_call() -> None:
    """OAI-TOOLS-09, OAI-TOOLS-17: limit 1 keeps the first call, even if a later one is broken."""
    reply = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>'
        '<tool_call>{"name": '
    )
    assert parse(HERMES, reply, limit=1) == ParsedReply(None, (PARIS,))


def test_hermes_forced_openings() -> None:
    """OAI-TOOLS-09, OAI-TOOLS-14, OAI-TOOLS-15: the opening is the prompt's; parse it + reply."""
    named = HERMES.opening("get_weather")
    assert named == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert parse(HERMES, named + '{"city": "Paris"}}\n</tool_call>') == ParsedReply(None, (PARIS,))
    required = HERMES.opening(None)
    assert required == '<tool_call>\n{"name": "'
    reply = 'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert parse(HERMES, required + reply) == ParsedReply(None, (PARIS,))


def test_hermes_opening_escapes_the_name() -> None:
    """OAI-TOOLS-15: a forced name is written as JSON string content."""
    assert HERMES.opening('a"b') == '<tool_call>\n{"name": "a\\"b", "arguments": '


# -- lfm2 (LiquidAI)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",
            ParsedReply(None, (PARIS,)),
        ),
        (
            "<|tool_call_start|>[get_weather(city='Paris'), get_weather(city=\"Tokyo\")]"
            "<|tool_call_end|>",
            ParsedReply(None, (PARIS, TOKYO)),
        ),
        (
            "Checking.<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",
            ParsedReply("Checking.", (PARIS,)),
        ),
        (
            "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>"
            "<|tool_call_start|>[get_time()]<|tool_call_end|>",
            ParsedReply(None, (PARIS, TIME)),
        ),
        ("<|tool_call_start|>[get_weather(city='Paris')]", ParsedReply(None, (PARIS,))),
        ("<|tool_call_start|>[get_time()]<|tool_call_end|>", ParsedReply(None, (TIME,))),
        (  # the template's rendering of arguments given as a JSON string
            '<|tool_call_start|>[get_weather(**{"city": "Paris"})]<|tool_call_end|>',
            ParsedReply(None, (PARIS,)),
        ),
    ],
    ids=["single", "two", "content-before", "two-blocks", "unclosed", "no-args", "spread"],
)
def test_lfm2_calls(reply: str, expected: ParsedReply) -> None:
    """OAI-TOOLS-08: LFM2 `<|tool_call_start|>[f(a='x')]<|tool_call_end|>` lists are calls."""
    assert parse(LFM2, reply) == expected


def test_lfm2_literals_become_json() -> None:
    """OAI-TOOLS-08: Python literals become JSON (True -> true, None -> null, tuples -> lists)."""
    reply = (
        "<|tool_call_start|>[get_weather(a=True, b=None, c=-2.5, d=[1, (2, 3)], "
        "e={'k': False}, f=null, g=true)]<|tool_call_end|>"
    )
    found = parse(LFM2, reply)
    assert found is not None
    assert json.loads(found.calls[0].arguments) == {
        "a": True,
        "b": None,
        "c": -2.5,
        "d": [1, [2, 3]],
        "e": {"k": False},
        "f": None,
        "g": True,
    }


@pytest.mark.parametrize(
    "reply",
    [
        "It is sunny in Paris.",
        "<|tool_call_start|>[get_weather(city='Paris'<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather('Paris')]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city=__import__('os').getcwd())]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city=1e999)]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city=b'x')]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(**['Paris'])]<|tool_call_end|>",
        "<|tool_call_start|>[get_weather(city={1: 'x'})]<|tool_call_end|>",
        "<|tool_call_start|>[os.remove(path='x')]<|tool_call_end|>",
        "<|tool_call_start|>[delete_all()]<|tool_call_end|>",
        "<|tool_call_start|>[]<|tool_call_end|>",
        "<|tool_call_start|>['get_weather']<|tool_call_end|>",
    ],
    ids=[
        "no-call",
        "bad-syntax",
        "bare-name-value",
        "positional",
        "call-as-value",
        "infinite",
        "bytes",
        "spread-list",
        "non-string-key",
        "dotted-name",
        "unknown-function",
        "empty-list",
        "not-a-call",
    ],
)
def test_lfm2_reply_that_does_not_parse_is_content(reply: str) -> None:
    """OAI-TOOLS-08, OAI-TOOLS-21: no call, a malformed call or an unoffered name: None."""
    assert parse(LFM2, reply) is None


def test_lfm2_limit_keeps_the_first_call() -> None:
    """OAI-TOOLS-08, OAI-TOOLS-17: limit 1 keeps the first call."""
    reply = "<|tool_call_start|>[get_weather(city='Paris'), get_time()]<|tool_call_end|>"
    assert parse(LFM2, reply, limit=1) == ParsedReply(None, (PARIS,))


def test_lfm2_forced_openings() -> None:
    """OAI-TOOLS-08, OAI-TOOLS-14, OAI-TOOLS-15: the opening is the prompt's; parse it + reply."""
    named = LFM2.opening("get_weather")
    assert named == "<|tool_call_start|>[get_weather("
    reply = "city='Paris')]<|tool_call_end|>"
    assert parse(LFM2, named + reply) == ParsedReply(None, (PARIS,))
    required = LFM2.opening(None)
    assert required == "<|tool_call_start|>["
    reply = "get_weather(city='Paris')]<|tool_call_end|>"
    assert parse(LFM2, required + reply) == ParsedReply(None, (PARIS,))


# -- llama3 (Llama 3.1/3.2/3.3)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', ParsedReply(None, (PARIS,))),
        (
            '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_weather", "parameters": {"city": "Tokyo"}}',
            ParsedReply(None, (PARIS, TOKYO)),
        ),
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
            ParsedReply(None, (PARIS,)),
        ),
        (
            '\n {"name": "get_weather", "arguments": {"city": "Paris"}} \n',
            ParsedReply(None, (PARIS,)),
        ),
        (
            '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\"}"}',
            ParsedReply(None, (PARIS,)),
        ),
        ('{"name": "get_time", "parameters": {}}', ParsedReply(None, (TIME,))),
    ],
    ids=["single", "two", "python-tag", "arguments-alias", "string-arguments", "no-args"],
)
def test_llama3_calls(reply: str, expected: ParsedReply) -> None:
    """OAI-TOOLS-10: a Llama 3.x reply that is wholly `{"name", "parameters"}` is a call."""
    assert parse(LLAMA3, reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "The weather in Paris is sunny.",
        'Sure: {"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}} Done.',
        '{"name": "get_weather", "parameters": {"city": "Par',
        '{"name": "get_weather", "parameters": ["Paris"]}',
        '{"name": "get_weather", "parameters": "Paris"}',
        '{"name": "delete_all", "parameters": {}}',
        '{"answer": 42}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}};',
    ],
    ids=[
        "no-call",
        "content-before",
        "content-after",
        "truncated",
        "parameters-list",
        "parameters-string",
        "unknown-function",
        "plain-json",
        "trailing-separator",
    ],
)
def test_llama3_reply_that_does_not_parse_is_content(reply: str) -> None:
    """OAI-TOOLS-10, OAI-TOOLS-21: anything but whole calls to offered functions: None."""
    assert parse(LLAMA3, reply) is None


def test_llama3_limit_keeps_the_first_call() -> None:
    """OAI-TOOLS-10, OAI-TOOLS-17: limit 1 keeps the first call."""
    reply = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}'
    )
    assert parse(LLAMA3, reply, limit=1) == ParsedReply(None, (PARIS,))


def test_llama3_forced_openings() -> None:
    """OAI-TOOLS-10, OAI-TOOLS-14, OAI-TOOLS-15: the opening is the prompt's; parse it + reply."""
    named = LLAMA3.opening("get_weather")
    assert named == '{"name": "get_weather", "parameters": '
    assert parse(LLAMA3, named + '{"city": "Paris"}}') == ParsedReply(None, (PARIS,))
    required = LLAMA3.opening(None)
    assert required == '{"name": "'
    reply = 'get_weather", "parameters": {"city": "Paris"}}'
    assert parse(LLAMA3, required + reply) == ParsedReply(None, (PARIS,))


# -- the format registry and templates


def test_formats_are_the_table_in_order() -> None:
    """OAI-TOOLS-11: the formats are read from spec/policy/tool_call_formats.yaml, in order."""
    assert list(FORMATS) == ["hermes", "lfm2", "llama3"]
    assert all(fmt.markers for fmt in FORMATS.values())


@pytest.mark.parametrize("name", ["hermes", "lfm2", "llama3"])
def test_template_selects_its_format(name: str) -> None:
    """OAI-TOOLS-11, OAI-TOOLS-24: the call format is read off the template text."""
    text = template(name)
    assert takes_tools(text)
    found = format_of(text)
    assert found is not None
    assert found.name == name


def test_template_without_tools() -> None:
    """OAI-TOOLS-23: a template that does not read `tools` takes no tools and has no format."""
    assert not takes_tools(CHATML)
    assert format_of(CHATML) is None


def test_template_with_tools_in_an_unknown_format() -> None:
    """OAI-TOOLS-24: a template that reads `tools` in an unrecognised call syntax."""
    assert takes_tools(GEMMA_STYLE)
    assert format_of(GEMMA_STYLE) is None


def test_template_that_does_not_parse_takes_no_tools() -> None:
    """OAI-TOOLS-23: a template Jinja cannot parse is not taken to read `tools`."""
    assert not takes_tools("{% for tool in tools %}")


def test_template_with_generation_tags_is_read() -> None:
    """OAI-TOOLS-23: transformers' `{% generation %}` tag does not hide `tools`."""
    text = "{% if tools %}x{% endif %}{% generation %}{{ messages }}{% endgeneration %}"
    assert takes_tools(text)


# -- the templates rendered by the real tokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

RENDERED_CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "lfm2": "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
}
RENDERED_STRING_CALLS = {
    **RENDERED_CALLS,
    "lfm2": '<|tool_call_start|>[get_weather(**{"city": "Paris"})]<|tool_call_end|>',
}
RENDERED_RESULTS = {
    "hermes": "<|im_start|>user\n<tool_response>\n18C and sunny\n</tool_response><|im_end|>",
    "lfm2": "<|im_start|>tool\n<|tool_response_start|>18C and sunny<|tool_response_end|>",
    "llama3": "<|im_start|>ipython\n18C and sunny<|im_end|>",
}


def render(name: str, arguments: Any) -> str:
    """A tool call and its result rendered by test template `name` with SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted_default())
    call: dict[str, Any] = {"id": "call_1", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = arguments
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]
    text = tokenizer.apply_chat_template(
        messages,
        tools=[*TOOLS],
        chat_template=template(name),
        add_generation_prompt=True,
        tokenize=False,
    )
    assert isinstance(text, str)
    return text


@pytest.mark.model
@pytest.mark.parametrize("name", ["hermes", "lfm2", "llama3"])
def test_template_renders_mapping_arguments(name: str) -> None:
    """OAI-TOOLS-08, OAI-TOOLS-09, OAI-TOOLS-10: history calls (arguments as a mapping) and
    tool results render in the format's syntax; the tools are listed; the prompt opens a turn."""
    text = render(name, {"city": "Paris"})
    assert RENDERED_CALLS[name] in text
    assert RENDERED_RESULTS[name] in text
    assert "The current weather in a city" in text
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.model
@pytest.mark.parametrize("name", ["hermes", "lfm2", "llama3"])
def test_template_renders_string_arguments(name: str) -> None:
    """OAI-TOOLS-08, OAI-TOOLS-09, OAI-TOOLS-10: history calls with arguments as a JSON string."""
    text = render(name, '{"city": "Paris"}')
    assert RENDERED_STRING_CALLS[name] in text
    assert RENDERED_RESULTS[name] in text


@pytest.mark.parametrize("name", ["hermes", "lfm2", "llama3"])
def test_rendered_history_call_parses_back(name: str) -> None:
    """OAI-TOOLS-08, OAI-TOOLS-09, OAI-TOOLS-10: the template's own call syntax parses back."""
    for calls in (RENDERED_CALLS, RENDERED_STRING_CALLS):
        assert FORMATS[name].parse(calls[name], OFFERED, None) == ParsedReply(None, (PARIS,))
