"""An Anthropic Messages conversation as the chat messages a template renders.

`system` (a string, or text blocks joined) becomes the system message. A message's content
is a string or blocks: in a user message, each `tool_result` becomes a `tool` message (in
order, before the message's text, as Anthropic puts results first) and the `text` blocks
join as the user's message; in an assistant message, `text` blocks join as its content,
`thinking` blocks as its `reasoning_content`, and each `tool_use` is one of its
`tool_calls` (its `input` passed as the object templates write with `tojson`). Consecutive
messages of one role merge, as Anthropic merges them. A `tool_result` marked `is_error`
reaches the template as `Error: <content>`: no template has a slot for the flag.

`image`, `document` and every other block type are refused naming the block: this server
reads text. `redacted_thinking` is reported unused (its text is not readable here), as is
a text block's `citations`. Where each chat message came from is kept (`Conversation.origin`)
so a refusal of the chat path names the Messages field (`messages[2]`, not the chat's index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ...errors import FieldNotHonoured, InvalidParameter
from ...generated import v1

ERROR_PREFIX = "Error: "  # a failed tool's result, as the model reads it


@dataclass(slots=True)
class Conversation:
    """The chat messages, each one's origin in the request, and the block members unused."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    origin: list[str] = field(default_factory=list)  # chat message i came from origin[i]
    unused: list[str] = field(default_factory=list)

    def add(self, message: dict[str, Any], where: str) -> None:
        """Append `message`, merged into the last one when both are of one role (not tool)."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == message["role"] != "tool":
            _merge(last, message)
            return
        self.messages.append(message)
        self.origin.append(where)


def conversation(
    system: str | Sequence[v1.MessageContentBlockParam] | None,
    messages: Sequence[v1.MessageParam],
) -> Conversation:
    """The chat messages of `system` and `messages`."""
    out = Conversation()
    text = _system(system, out)
    if text:
        out.add({"role": "system", "content": text}, "system")
    for k, message in enumerate(messages):
        where = f"messages[{k}]"
        if isinstance(message.content, str):
            out.add({"role": message.role, "content": message.content}, where)
        elif message.role == "user":
            _user(message.content, where, out)
        else:
            _assistant(message.content, where, out)
    return out


def _system(system: str | Sequence[v1.MessageContentBlockParam] | None, out: Conversation) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(_text(block, f"system[{j}]", out) for j, block in enumerate(system))


def _user(blocks: Sequence[v1.MessageContentBlockParam], where: str, out: Conversation) -> None:
    texts: list[str] = []
    for j, block in enumerate(blocks):
        here = f"{where}.content[{j}]"
        if block.type == "tool_result":
            out.add(_result(block, here), here)
        elif block.type == "redacted_thinking":
            out.unused.append(here)
        else:
            texts.append(_text(block, here, out))
    if texts:
        out.add({"role": "user", "content": "".join(texts)}, where)


def _assistant(
    blocks: Sequence[v1.MessageContentBlockParam], where: str, out: Conversation
) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{where}.content[{j}]"
        if block.type == "tool_use":
            calls.append(_call(block, here))
        elif block.type == "thinking":
            thoughts.append(_member(block.thinking, here, "thinking"))
        elif block.type == "redacted_thinking":
            out.unused.append(here)
        else:
            texts.append(_text(block, here, out))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    out.add(message, where)


def _text(block: v1.MessageContentBlockParam, where: str, out: Conversation) -> str:
    """A `text` block's text; any other type refused naming it."""
    if block.type != "text":
        raise FieldNotHonoured(
            f"{where}.type", f"on messages: `{block.type}` content (this server reads text blocks)"
        )
    if block.citations:
        out.unused.append(f"{where}.citations")
    return _member(block.text, where, "text")


def _result(block: v1.MessageContentBlockParam, where: str) -> dict[str, Any]:
    """A `tool_result` as the chat `tool` message answering its call."""
    call_id = _member(block.tool_use_id, where, "tool_use_id")
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        scratch = Conversation()
        text = "".join(
            _text(_block(part, f"{where}.content[{i}]"), f"{where}.content[{i}]", scratch)
            for i, part in enumerate(content)
        )
    if block.is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "content": text, "tool_call_id": call_id}


def _block(part: v1.JsonObject, where: str) -> v1.MessageContentBlockParam:
    """A tool result's content part read as a content block (it needs a `type`)."""
    try:
        return v1.MessageContentBlockParam.model_validate(part.model_dump(mode="json"))
    except ValidationError:
        raise InvalidParameter(f"{where}.type", "A content block needs its `type`.") from None


def _call(block: v1.MessageContentBlockParam, where: str) -> dict[str, Any]:
    """A `tool_use` as one of the assistant message's `tool_calls`."""
    function = {
        "name": _member(block.name, where, "name"),
        "arguments": block.input if block.input is not None else {},
    }
    return {"id": _member(block.id, where, "id"), "type": "function", "function": function}


def _member(value: str | None, where: str, name: str) -> str:
    if value is None:
        raise InvalidParameter(f"{where}.{name}", f"This content block needs `{name}`.")
    return value


def _merge(last: dict[str, Any], message: Mapping[str, Any]) -> None:
    """`message` folded into `last` (one role): texts joined by a blank line, calls added."""
    texts = [t for t in (last.get("content"), message.get("content")) if t]
    last["content"] = "\n\n".join(texts) if texts else None
    if message.get("reasoning_content"):
        last["reasoning_content"] = (last.get("reasoning_content") or "") + message[
            "reasoning_content"
        ]
    if message.get("tool_calls"):
        last["tool_calls"] = [*(last.get("tool_calls") or ()), *message["tool_calls"]]
