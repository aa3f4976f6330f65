"""Rendering an OpenAI-shaped chat into prompt token ids.

The model's chat template renders the messages (a generic ChatML template
stands in when the model has none, OAI-TOKIDS-07). The rendered text is
tokenized with the tokenizer's special tokens unless it already begins with
the BOS text, so the ids hold one BOS at most (OAI-TOKIDS-02). A chat
whose last message is the assistant's is a partial answer to continue: the
messages before it are rendered with the generation prompt and the partial
content is appended raw, with no end of turn (OAI-CONT-01).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from .. import chatmessages
from ..base import ChatPrompt, PromptError
from ..chatmessages import (
    FALLBACK_TEMPLATE,
    RESERVED_KWARGS,
    ROLES,
    content_text,
    normalize_message,
    refuse_tool_history,
    split_partial,
    template_variables,
    tokenize_with_one_bos,
)

__all__ = [
    "FALLBACK_TEMPLATE",
    "RESERVED_KWARGS",
    "ROLES",
    "content_text",
    "normalize_message",
    "render_chat",
    "render_text",
    "template_variables",
    "tokenize_rendered",
]


def render_text(tokenizer: PreTrainedTokenizerBase, prompt: ChatPrompt) -> str:
    """The chat rendered as text, ready for the assistant's next tokens.

    Tools go to the model's own template (OAI-TOOLS-02); the generic fallback
    cannot render tool history, so it refuses it rather than drop it
    (OAI-TOOLS-20). A forced call's opening follows the render.
    """
    messages, partial = split_partial(prompt.messages)
    template = None if tokenizer.chat_template else FALLBACK_TEMPLATE
    if template is not None:
        refuse_tool_history(prompt.messages)
    tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
        [dict(t) for t in prompt.tools] if prompt.tools else None
    )
    try:
        rendered = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            tools=tools,
            **template_variables(prompt.template_kwargs),
        )
    except TemplateError as exc:  # the template refused these messages (raise_exception)
        raise PromptError(f"the model's chat template refused these messages: {exc}") from exc
    return str(rendered) + partial + prompt.opening


def tokenize_rendered(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of a rendered chat, with exactly the BOS the template wrote or none."""
    bos = tokenizer.bos_token if isinstance(tokenizer.bos_token, str) else None

    def encode(body: str, special: bool) -> list[int]:
        ids: list[int] = tokenizer.encode(body, add_special_tokens=special)
        return ids

    return tokenize_with_one_bos(text, bos, tokenizer.bos_token_id, encode)


def render_chat(tokenizer: PreTrainedTokenizerBase, prompt: ChatPrompt) -> list[int]:
    """Token ids of the chat, rendered with the generation prompt."""
    return tokenize_rendered(tokenizer, render_text(tokenizer, prompt))


def user_span(tokenizer: PreTrainedTokenizerBase, prompt: ChatPrompt) -> tuple[int, int] | None:
    """The last user message's token positions in `render_chat(prompt)` (chatmessages.py)."""

    def head(messages: list[dict[str, Any]]) -> str | None:
        try:
            rendered = tokenizer.apply_chat_template(
                cast(list[dict[str, str]], messages),
                tokenize=False,
                add_generation_prompt=False,
                tools=[dict(t) for t in prompt.tools] if prompt.tools else None,
                **template_variables(prompt.template_kwargs),
            )
        except (TemplateError, ValueError, TypeError, KeyError, IndexError):  # refused
            return None
        return rendered if isinstance(rendered, str) else None

    text = render_text(tokenizer, prompt)
    return chatmessages.user_span(prompt, text, head, partial(tokenize_rendered, tokenizer))
