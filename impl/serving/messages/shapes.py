"""A chat completion as Anthropic's Message, and its stream as Anthropic's events.

A Message's `content` is its blocks in the order the reply made them: `thinking` (the
reasoning span; `signature` empty, as nothing signs it here), `text`, then one `tool_use`
per call (`toolu_` ids, `input` the parsed arguments). `stop_reason` is `end_turn`,
`max_tokens`, `stop_sequence` (with `stop_sequence` the sequence, from the chat choice's
`stop_reason`) or `tool_use`. `usage.input_tokens` are the prompt tokens the prompt cache
did not hold and `cache_read_input_tokens` those it did (Anthropic's split: their sum is
the prompt); nothing is written to a cache on request (`cache_creation_input_tokens` 0).

A stream is `message_start`, `ping`, then per block `content_block_start`, its deltas
(`thinking_delta`, `text_delta`, one `input_json_delta` per call: a call is sent whole
once it is complete, LOC-CHAT-57) and `content_block_stop`; the chunk after the choices
(`choices: []`, with the usage and `millm_steering`) becomes `message_delta` (the stop
reason, the whole usage, miserver's members) and `message_stop`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ApiError, anthropic_error
from ..relay import EXTRAS
from ..results import Encoded
from .request import stop_reason


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def new_tool_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def usage(chat: Mapping[str, Any] | None) -> dict[str, int]:
    """A chat usage in Anthropic's names."""
    prompt = int((chat or {}).get("prompt_tokens") or 0)
    cached = int(((chat or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int((chat or {}).get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    """A chat tool call as a `tool_use` block (arguments that are not a JSON object, as
    a call the grammar did not hold may make, come as `{"arguments": <text>}`)."""
    function = call["function"]
    text = function.get("arguments") or "{}"
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    given = parsed if isinstance(parsed, dict) else {"arguments": text}
    return {"type": "tool_use", "id": new_tool_id(), "name": function["name"], "input": given}


def blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat message's content as blocks: thinking, text, then its calls."""
    out: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    out.extend(tool_use(call) for call in message.get("tool_calls") or ())
    return out


@dataclass(slots=True)
class Message:
    """The Message being answered: its id and model, and what the end says."""

    id: str
    model: str
    stop: str | None = None  # the chat choice's finish_reason
    sequence: str | None = None  # the stop sequence that ended it
    usage: dict[str, int] = field(default_factory=lambda: usage(None))
    extras: dict[str, Any] = field(default_factory=dict)

    def body(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason(self.stop, self.sequence),
            "stop_sequence": self.sequence,
            "usage": self.usage,
            **self.extras,
        }


def from_chat(message: Message, chat: Mapping[str, Any], steering: str) -> dict[str, Any]:
    """The Message of a chat completion body (its one choice)."""
    choice = chat["choices"][0]
    message.stop, message.sequence = choice["finish_reason"], choice.get("stop_reason")
    message.usage = usage(chat.get("usage"))
    message.extras["millm_steering"] = steering
    for key in EXTRAS:
        if key in chat:
            message.extras[key] = chat[key]
    return message.body(blocks(choice["message"]))


class Events:
    """A chat stream's chunks as Anthropic's events, in order."""

    def __init__(self, message: Message) -> None:
        self.message = message
        self._started = False
        self._index = 0  # the next block's index
        self._open: str | None = None  # the open block's type

    def chunk(self, raw: dict[str, Any] | Encoded) -> Iterator[dict[str, Any]]:
        chunk = json.loads(raw.json) if isinstance(raw, Encoded) else raw
        if not self._started:
            self._started = True
            self.message.usage = usage(chunk.get("usage"))
            yield {"type": "message_start", "message": self.message.body([])}
            yield {"type": "ping"}
        choices = chunk.get("choices") or []
        if not choices:
            yield from self._trailer(chunk)
            return
        choice = choices[0]
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            yield from self._piece("thinking", {"thinking": delta["reasoning_content"]})
        if delta.get("content"):
            yield from self._piece("text", {"text": delta["content"]})
        for call in delta.get("tool_calls") or ():
            yield from self._close()
            yield from self._call(call)
        if choice.get("finish_reason") is not None:
            self.message.stop = choice["finish_reason"]
            self.message.sequence = choice.get("stop_reason")
            yield from self._close()

    def _piece(self, kind: str, members: dict[str, str]) -> Iterator[dict[str, Any]]:
        if self._open != kind:
            yield from self._close()
            start = {"type": kind, **{name: "" for name in members}}
            if kind == "thinking":
                start["signature"] = ""
            yield {"type": "content_block_start", "index": self._index, "content_block": start}
            self._open = kind
        delta = {"type": f"{kind}_delta", **members}
        yield {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> Iterator[dict[str, Any]]:
        if self._open is None:
            return
        yield {"type": "content_block_stop", "index": self._index}
        self._open = None
        self._index += 1

    def _call(self, call: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        block = tool_use(call)
        start = {**block, "input": {}}
        yield {"type": "content_block_start", "index": self._index, "content_block": start}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield {"type": "content_block_delta", "index": self._index, "delta": delta}
        yield {"type": "content_block_stop", "index": self._index}
        self._index += 1

    def _trailer(self, chunk: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """A `choices: []` chunk: the verdicts, the activations, or the last (usage and
        steering), which ends the stream."""
        for key in EXTRAS:
            if key in chunk:
                self.message.extras[key] = chunk[key]
        if "millm_steering" not in chunk:
            return
        yield from self._close()
        self.message.extras["millm_steering"] = chunk["millm_steering"]
        if chunk.get("usage") is not None:
            self.message.usage = usage(chunk["usage"])
        end = {
            "stop_reason": stop_reason(self.message.stop, self.message.sequence),
            "stop_sequence": self.message.sequence,
        }
        yield {
            "type": "message_delta",
            "delta": end,
            "usage": self.message.usage,
            **self.message.extras,
        }
        yield {"type": "message_stop"}

    def failed(self, exc: ApiError) -> Iterator[dict[str, Any]]:
        """Anthropic's `error` event."""
        yield {"type": "error", "error": anthropic_error(exc.body()["error"], exc.status)}
