"""A Responses API conversation: input items as stored, and as the chat messages they render as.

`items(input)` reads a request's `input` (a string, or a list of items) into the items the
store keeps and `input_items` lists, each with an id: `message` (text parts only: an
image, a file or audio is refused naming its part, never dropped), `function_call`,
`function_call_output` and `reasoning`. Any other item type is refused naming it.

`messages(conversation, instructions)` turns items into the chat messages the template
renders: `instructions` first as a system message, a message's text parts joined, a
`function_call` as a call of the assistant message before it (or of a new one: parallel
calls share one message), a `function_call_output` as a `tool` message, and a
`reasoning` item's text as the next assistant message's `reasoning_content`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import FieldNotHonoured, InvalidParameter

ITEM_PREFIX = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "reasoning": "rs_",
}
"""Item type -> the prefix of the ids this server gives it (OpenAI's)."""

TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
"""Content part type -> the member holding its text; any other part is refused."""

ROLES = ("user", "assistant", "system", "developer")


def new_id(kind: str) -> str:
    return ITEM_PREFIX[kind] + secrets.token_hex(16)


def items(raw: Any) -> list[dict[str, Any]]:
    """The request's `input` as stored items, each with an id (an id sent is kept)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [_message({"role": "user", "content": raw}, "input")]
    return [_item(item, f"input[{i}]") for i, item in enumerate(raw)]


def _item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    kind = item.get("type") or "message"
    if kind == "message":
        return _message(item, where)
    if kind == "function_call":
        return {
            "type": "function_call",
            "id": _id(item, kind),
            "call_id": _text(item, "call_id", where),
            "name": _text(item, "name", where),
            "arguments": _text(item, "arguments", where),
            "status": "completed",
        }
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):  # a list of parts: their text, joined
            output = _joined(output if isinstance(output, list) else [], f"{where}.output")
        return {
            "type": "function_call_output",
            "id": _id(item, kind),
            "call_id": _text(item, "call_id", where),
            "output": output,
            "status": "completed",
        }
    if kind == "reasoning":
        out = {
            "type": "reasoning",
            "id": _id(item, kind),
            "summary": list(item.get("summary") or []),
        }
        if item.get("content"):
            out["content"] = list(item["content"])
        return out
    raise FieldNotHonoured(
        f"{where}.type",
        f"on responses: input items of type `{kind}` (this server reads `message`, "
        "`function_call`, `function_call_output` and `reasoning` items)",
    )


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidParameter(f"{where}.role", f"A message's role is one of {', '.join(ROLES)}.")
    content = item.get("content")
    assistant = role == "assistant"
    if isinstance(content, str):
        parts = [_part(content, assistant)]
    elif isinstance(content, list):
        parts = [_checked(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    else:
        raise InvalidParameter(f"{where}.content", "A message's content is text or parts.")
    out = {"type": "message", "id": _id(item, "message"), "role": role, "content": parts}
    out["status"] = "completed"
    return out


def _part(text: str, assistant: bool) -> dict[str, Any]:
    if assistant:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "input_text", "text": text}


def _checked(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind not in TEXT_PARTS:
        raise InvalidParameter(
            f"{where}.type",
            f"Content parts of type `{kind}` are not supported: this server reads text parts "
            "(`input_text`, `output_text`, `refusal`) only, and refuses any other rather than "
            "drop it.",
        )
    text = part.get(TEXT_PARTS[kind])
    if not isinstance(text, str):
        raise InvalidParameter(f"{where}.{TEXT_PARTS[kind]}", "A text part needs its text.")
    if kind == "output_text":
        return {"annotations": [], "logprobs": [], **part}
    return dict(part)


def _joined(parts: Sequence[Any], where: str) -> str:
    return "".join(
        _checked(part, f"{where}[{j}]")[TEXT_PARTS[part["type"]]] for j, part in enumerate(parts)
    )


def _id(item: Mapping[str, Any], kind: str) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and given else new_id(kind)


def _text(item: Mapping[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidParameter(f"{where}.{name}", f"A `{item.get('type')}` item needs `{name}`.")
    return value


# -- as chat messages ---------------------------------------------------------------------


def messages(
    conversation: Sequence[Mapping[str, Any]], instructions: str | None
) -> list[dict[str, Any]]:
    """The chat messages `conversation` renders as, `instructions` first."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    reasoning: list[str] = []  # a reasoning item's text, for the next assistant message
    for item in conversation:
        kind = item["type"]
        if kind == "reasoning":
            reasoning.append(_reasoning_text(item))
        elif kind == "message":
            text = "".join(p.get(TEXT_PARTS.get(p["type"], "text"), "") for p in item["content"])
            message: dict[str, Any] = {"role": item["role"], "content": text}
            if item["role"] == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            out.append(message)
        elif kind == "function_call":
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            if reasoning and "reasoning_content" not in last:
                last["reasoning_content"] = "".join(reasoning)
                reasoning = []
            last.setdefault("tool_calls", []).append(_call(item))
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
    return out


def _reasoning_text(item: Mapping[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    """A history call as the chat path passes it to the template: `arguments` parsed when
    it is a JSON object (templates write it with `tojson`), else as sent (OAI-TOOLS-18)."""
    arguments: Any = item["arguments"]
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        arguments = parsed
    function = {"name": item["name"], "arguments": arguments}
    return {"id": item["call_id"], "type": "function", "function": function}
