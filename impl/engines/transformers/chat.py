"""Rendering an OpenAI-shaped chat into prompt token ids.

The model's chat template renders the messages (a generic ChatML template
stands in when the model has none, OAI-TOKIDS-07). The rendered text is
tokenized with the tokenizer's special tokens unless it already begins with
the BOS text, so the ids hold one BOS at most (OAI-TOKIDS-02..05). A chat
whose last message is the assistant's is a partial answer to continue: the
messages before it are rendered with the generation prompt and the partial
content is appended raw, with no end of turn (OAI-CONT-01..03).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from ..base import ChatPrompt, PromptError

logger = logging.getLogger(__name__)

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, for models that ship no chat template."""

ROLES = frozenset({"system", "user", "assistant", "tool", "function"})
RESERVED_KWARGS = frozenset(
    {"conversation", "chat_template", "tokenize", "add_generation_prompt", "return_dict"}
    | {"continue_final_message", "return_assistant_tokens_mask"}
)
"""Arguments of `apply_chat_template` that template variables may not override."""
_RENDERED_AS = {"function": "tool"}


def content_text(content: Any) -> str:
    """A message's content as text: a string, null, or OpenAI text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    raise PromptError(f"unsupported message content: {type(content).__name__}")


def _part_text(part: Any) -> str:
    if isinstance(part, Mapping) and part.get("type") == "text":
        return str(part.get("text") or "")
    raise PromptError("only text content parts are supported")


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy the template can render: a known role and string content."""
    role = message.get("role")
    if role not in ROLES:
        raise PromptError(f"unsupported message role: {role!r}")
    normalized = dict(message)
    normalized["role"] = _RENDERED_AS.get(role, role)
    normalized["content"] = content_text(message.get("content"))
    return normalized


def template_variables(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables, less any that would override how we render."""
    dropped = sorted(RESERVED_KWARGS.intersection(kwargs))
    if dropped:
        logger.warning("ignoring chat template variables %s", ", ".join(dropped))
    return {key: value for key, value in kwargs.items() if key not in RESERVED_KWARGS}


def render_text(tokenizer: PreTrainedTokenizerBase, prompt: ChatPrompt) -> str:
    """The chat rendered as text, ready for the assistant's next tokens."""
    messages = [normalize_message(m) for m in prompt.messages]
    partial = ""
    if messages and messages[-1]["role"] == "assistant":
        partial = messages.pop()["content"]
        if not messages:
            raise PromptError(
                "a trailing assistant message is a partial answer to continue; "
                "it needs at least one message before it"
            )
    template = None if tokenizer.chat_template else FALLBACK_TEMPLATE
    try:
        rendered = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            **template_variables(prompt.template_kwargs),
        )
    except TemplateError as exc:  # the template refused these messages (raise_exception)
        raise PromptError(f"the model's chat template refused these messages: {exc}") from exc
    return str(rendered) + partial


def tokenize_rendered(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of a rendered chat, with exactly the BOS the template wrote or none."""
    bos = tokenizer.bos_token
    template_wrote_bos = isinstance(bos, str) and bool(bos) and text.startswith(bos)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=not template_wrote_bos)
    return _without_double_bos(ids, tokenizer.bos_token_id)


def _without_double_bos(ids: Sequence[int], bos_id: int | None) -> list[int]:
    if bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_id:
        return list(ids[1:])
    return list(ids)


def render_chat(tokenizer: PreTrainedTokenizerBase, prompt: ChatPrompt) -> list[int]:
    """Token ids of the chat, rendered with the generation prompt."""
    return tokenize_rendered(tokenizer, render_text(tokenizer, prompt))
