"""Rendering a chat with the GGUF file's own `tokenizer.chat_template`.

The template is run by Jinja2 in a sandbox set up as transformers sets it up
(`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with
`raise_exception`, `strftime_now` and a `tojson` that does not escape HTML),
with the same variables: `messages`, `add_generation_prompt=True`, the
special tokens (`bos_token`, `eos_token`, ...), `tools` and `documents`, and
the request's template variables (LOC-CHAT-36). llama-cpp-python's built-in
chat formats are not used. A file without a template gets the same ChatML
fallback as the transformers engine (OAI-TOKIDS-07), and the messages are
prepared by the same code (`..chatmessages`), so both engines produce the
same ids for the same file (OAI-TOKIDS-01). Continuation and the BOS rule are
as in the transformers engine (engines/transformers/chat.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, partial
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .. import chatmessages
from ..base import ChatPrompt, PromptError
from ..chatmessages import (
    FALLBACK_TEMPLATE,
    refuse_tool_history,
    split_partial,
    template_variables,
    tokenize_with_one_bos,
)

Tokenize = Callable[[str, bool], list[int]]
"""`tokenize(text, add_special_tokens)`, as the engine does it."""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A model's chat template and the special tokens it may write."""

    source: str | None
    special_tokens: Mapping[str, str]
    bos_token_id: int | None

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateNamespace(Namespace):
    """Jinja's `namespace`, refusing underscore names (as transformers does)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a chat template cannot set {name!r} on a namespace")


def _plain_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    return dict(*args, **kwargs)


@lru_cache(maxsize=16)
def compile_template(source: str) -> Template:
    """`source` compiled in a sandbox set up as transformers sets it up."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _plain_dict
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def render_text(template: ChatTemplate, prompt: ChatPrompt) -> str:
    """The chat rendered as text, ready for the assistant's next tokens.

    As on transformers: tools go to the template (OAI-TOOLS-02); the fallback
    refuses tool history rather than drop it (OAI-TOOLS-20); a forced call's
    opening follows the render (OAI-TOOLS-32).
    """
    messages, continued = split_partial(prompt.messages)
    if template.source is None:
        refuse_tool_history(prompt.messages)
    try:
        rendered = _render(template, prompt, messages, generation=True)
    except TemplateError as exc:  # a syntax error, or the template's raise_exception
        raise PromptError(f"the model's chat template refused these messages: {exc}") from exc
    return rendered + continued + prompt.opening


def _render(
    template: ChatTemplate, prompt: ChatPrompt, messages: list[dict[str, Any]], generation: bool
) -> str:
    """`messages` through the template with `prompt`'s tools and variables."""
    compiled = compile_template(template.source or FALLBACK_TEMPLATE)
    return compiled.render(
        tools=[dict(t) for t in prompt.tools] if prompt.tools else None,
        documents=None,
        **template.special_tokens,
        **template_variables(prompt.template_kwargs),
        messages=messages,
        add_generation_prompt=generation,
    )


def user_span(
    template: ChatTemplate, tokenize: Tokenize, prompt: ChatPrompt
) -> tuple[int, int] | None:
    """The last user message's token positions in `render_chat(prompt)` (chatmessages.py)."""

    def head(messages: list[dict[str, Any]]) -> str | None:
        try:
            return _render(template, prompt, messages, generation=False)
        except TemplateError:
            return None

    text = render_text(template, prompt)
    return chatmessages.user_span(
        prompt, text, head, partial(tokenize_rendered, template, tokenize)
    )


def tokenize_rendered(template: ChatTemplate, tokenize: Tokenize, text: str) -> list[int]:
    """Ids of a rendered chat, with exactly the BOS the template wrote or none."""
    return tokenize_with_one_bos(text, template.bos_token, template.bos_token_id, tokenize)


def render_chat(template: ChatTemplate, tokenize: Tokenize, prompt: ChatPrompt) -> list[int]:
    """Token ids of the chat, rendered with the generation prompt."""
    return tokenize_rendered(template, tokenize, render_text(template, prompt))
