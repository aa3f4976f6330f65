"""OpenAI-shaped chat messages made ready for a chat template: pure, torch-free.

Both engines render chats with the model's own template; what they hand the
template is prepared here so the two agree token for token (OAI-TOKIDS-01):
known roles only (`developer` is rendered as `system`, LOC-CHAT-03, and
`function` as `tool`), content as a string (null, a string, or text parts),
a history's reasoning under every name templates read (LOC-CHAT-10), keys
whose value is null dropped (as transformers' `apply_chat_template` does),
and a trailing assistant message split off as a partial answer to continue
(OAI-CONT-01).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import ChatPrompt, PromptError

logger = logging.getLogger(__name__)

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, for models that ship no chat template (OAI-TOKIDS-07)."""

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
RESERVED_KWARGS = frozenset(
    {"conversation", "chat_template", "tokenize", "add_generation_prompt", "return_dict"}
    | {"continue_final_message", "return_assistant_tokens_mask"}
)
"""Arguments of `apply_chat_template` that template variables may not override."""
_RENDERED_AS = {"function": "tool", "developer": "system"}
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""The names chat templates read a message's reasoning under (Qwen3, DeepSeek: the first)."""


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
    normalized = {key: value for key, value in message.items() if value is not None}
    normalized["role"] = _RENDERED_AS.get(role, role)
    normalized["content"] = content_text(message.get("content"))
    return _with_reasoning_aliases(normalized)


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """The reasoning under every name templates read (LOC-CHAT-10)."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {**message, **dict.fromkeys(REASONING_FIELDS, reasoning)}


def refuse_tool_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse tool calls and tool results a template cannot render (OAI-TOOLS-20)."""
    for i, message in enumerate(messages):
        if message.get("tool_calls"):
            where = f"messages[{i}].tool_calls"
        elif message.get("role") in {"tool", "function"}:
            where = f"messages[{i}]"
        else:
            continue
        raise PromptError(
            "the model has no chat template, so tool calls and tool results in the history "
            "cannot be rendered (they are not dropped)",
            where,
        )


def template_variables(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables, less any that would override how we render."""
    dropped = sorted(RESERVED_KWARGS.intersection(kwargs))
    if dropped:
        logger.warning("ignoring chat template variables %s", ", ".join(dropped))
    return {key: value for key, value in kwargs.items() if key not in RESERVED_KWARGS}


def split_partial(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The normalized messages to render, and the partial answer to append raw.

    A trailing assistant message is a partial answer to continue (OAI-CONT-01);
    it needs a message before it to continue from.
    """
    normalized = [normalize_message(m) for m in messages]
    if not normalized or normalized[-1]["role"] != "assistant":
        return normalized, ""
    partial: str = normalized.pop()["content"]
    if not normalized:
        raise PromptError(
            "a trailing assistant message is a partial answer to continue; "
            "it needs at least one message before it"
        )
    return normalized, partial


def tokenize_with_one_bos(
    text: str,
    bos_token: str | None,
    bos_token_id: int | None,
    tokenize: Callable[[str, bool], list[int]],
) -> list[int]:
    """Ids of a rendered chat with exactly the BOS the template wrote, or the tokenizer's.

    `tokenize(text, add_special_tokens)` is the engine's tokenizer. A render that
    already begins with the BOS text gets no special tokens (OAI-TOKIDS-02);
    otherwise the tokenizer adds what it normally adds (OAI-TOKIDS-03); never
    two BOS (OAI-TOKIDS-05).
    """
    template_wrote_bos = bool(bos_token) and text.startswith(bos_token or "")
    return without_double_bos(tokenize(text, not template_wrote_bos), bos_token_id)


def without_double_bos(ids: Sequence[int], bos_id: int | None) -> list[int]:
    """`ids` with a doubled leading BOS collapsed to one (OAI-TOKIDS-05)."""
    if bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_id:
        return list(ids[1:])
    return list(ids)


def decision_prompt(prefix: str, suffix: str) -> ChatPrompt:
    """`prefix + suffix` as one user message, reasoning off (LOC-DECIDE-04)."""
    return ChatPrompt(({"role": "user", "content": prefix + suffix},), {"enable_thinking": False})


def prefix_length(
    text: str, ids: Sequence[int], prefix: str, suffix: str, *, tokenize: Callable[[str], list[int]]
) -> int:
    """How many leading `ids` (the rendered `text`) the prefix alone determines.

    The head of the render up to the prefix's end is tokenized on its own; the
    ids it shares with the full render, less its last (which may merge with
    what follows), are the state worth keeping.
    """
    at = text.find(prefix + suffix)
    if at < 0 or not prefix:
        return 0
    head = tokenize(text[: at + len(prefix)])
    return max(0, min(shared_prefix(head, ids), len(head) - 1))


def shared_prefix(head: Sequence[int], ids: Sequence[int]) -> int:
    """How many leading ids `head` and `ids` share."""
    shared = 0
    for a, b in zip(head, ids, strict=False):
        if a != b:
            break
        shared += 1
    return shared


HeadRender = Callable[[list[dict[str, Any]]], str | None]
"""Renders the messages before the last user one, with no generation prompt (None: refused)."""


def user_span(
    prompt: ChatPrompt, text: str, head: HeadRender, tokenize: Callable[[str], list[int]]
) -> tuple[int, int] | None:
    """The token positions [start, end) of the last user message's content in `text`, the
    render `render_chat` makes of `prompt` (its tools shown): a probe's `last_user` window
    (OAI-TOOLS-31). None when no user message has text.

    The content is looked for after `head`'s render of the messages before it (when that
    render is a prefix of the whole), else at its last place; characters map to tokens by
    tokenizing (`tokenize`, as the engine tokenizes a render) the render's head up to each
    end, as `prefix_length` does.
    """
    messages, _ = split_partial(prompt.messages)  # as the engines render them
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    content = "" if last is None else str(messages[last].get("content") or "")
    if last is None or not content:
        return None
    since = 0
    rendered = head(messages[:last]) if last else None
    if rendered is not None and text.startswith(rendered):
        since = len(rendered)
    start = text.find(content, since) if since else text.rfind(content)
    if start < 0:
        return None
    end = start + len(content)
    ids = tokenize(text)
    first = shared_prefix(tokenize(text[:start]), ids)
    upto = tokenize(text[:end])
    shared = shared_prefix(upto, ids)
    stop = shared if shared == len(upto) else shared + 1
    return (first, min(stop, len(ids))) if stop > first else None
