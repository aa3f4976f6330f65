"""The Response object and its stream's typed events, in OpenAI's shapes, made from what the
chat path answered (a chat completion body, or its stream of chunks).

`output_items(message, ...)` is a chat message as output items: `reasoning` (its
`reasoning_text`), `message` (one `output_text` part, with its tokens' log-probabilities
when asked) and one `function_call` per call. `Response` holds what a response carries
besides its output; `Events` turns a chat stream's chunks into the Responses events, each
numbered (`sequence_number`), and keeps the output for the final Response.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ApiError
from ..relay import EXTRAS
from ..results import Encoded
from . import items

FINISHED = {"length": ("incomplete", {"reason": "max_output_tokens"})}
"""A chat finish reason -> the Response's status and `incomplete_details` (else completed)."""

FAILED_CODE = "server_error"  # the Response's `error.code` for any failure after the start


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def usage(chat: Mapping[str, Any], reasoning_tokens: int = 0) -> dict[str, Any]:
    """Chat's usage in the Responses API's names. Every input token the cache did not hold
    is written to it (a slot keeps its prompt's KV); `reasoning_tokens` are the reasoning
    span's text's tokens (its markers not counted), at most the output's."""
    prompt, completion = int(chat["prompt_tokens"]), int(chat["completion_tokens"])
    cached = int((chat.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt - cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
        "total_tokens": prompt + completion,
    }


def token_logprobs(chat: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` entries as the Responses API's (`bytes` always a list)."""
    return [_logprob(entry, alternatives=True) for entry in chat or ()]


def _logprob(entry: Mapping[str, Any], alternatives: bool) -> dict[str, Any]:
    token = str(entry["token"])
    raw = entry.get("bytes")
    out = {
        "token": token,
        "logprob": entry["logprob"],
        "bytes": list(raw) if raw is not None else list(token.encode("utf-8")),
    }
    if alternatives:
        out["top_logprobs"] = [_logprob(t, False) for t in entry.get("top_logprobs") or ()]
    return out


def reasoning_item(text: str, item_id: str | None = None, done: bool = True) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id or items.new_id("reasoning"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}] if done else [],
        "status": "completed" if done else "in_progress",
    }


def text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(
    parts: list[dict[str, Any]], status: str, item_id: str | None = None
) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or items.new_id("message"),
        "role": "assistant",
        "status": status,
        "content": parts,
    }


def call_item(call: Mapping[str, Any], done: bool = True) -> dict[str, Any]:
    function = call["function"]
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments or {}, ensure_ascii=False)
    return {
        "type": "function_call",
        "id": items.new_id("function_call"),
        "call_id": call.get("id") or "call_" + secrets.token_hex(12),
        "name": function["name"],
        "arguments": arguments if done else "",
        "status": "completed" if done else "in_progress",
    }


def output_items(
    message: Mapping[str, Any], logprobs: Mapping[str, Any] | None, finish: str | None
) -> list[dict[str, Any]]:
    """A chat reply's message as output items: reasoning, the text, then each call."""
    out = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        out.append(reasoning_item(reasoning))
    calls = message.get("tool_calls") or []
    content = message.get("content")
    if content or not calls:
        entries = token_logprobs((logprobs or {}).get("content")) if logprobs else []
        status = "incomplete" if finish == "length" else "completed"
        out.append(message_item([text_part(content or "", entries)], status))
    out.extend(call_item(call) for call in calls)
    return out


@dataclass(slots=True, kw_only=True)
class Response:
    """What a Response carries besides its output: its id, model, times, the request's
    echoed members, and how it ended."""

    id: str
    model: str
    echo: Mapping[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    incomplete: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # millm_steering, verdicts, millm

    def ended(self, finish: str | None) -> None:
        self.status, self.incomplete = FINISHED.get(finish or "stop", ("completed", None))

    def body(self, output: list[dict[str, Any]]) -> dict[str, Any]:
        done = self.status not in ("in_progress", "queued")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if done and self.status == "completed" else None,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete,
            "model": self.model,
            "output": output,
            **({"usage": self.usage} if self.usage is not None else {}),  # none until the end
            **self.echo,
            **self.extras,
        }


Counter = Callable[[str], int]  # the tokens of a text (the reasoning's, for the usage)


def from_chat(response: Response, chat: Mapping[str, Any], count: Counter) -> dict[str, Any]:
    """The Response of a chat completion body (its one choice)."""
    choice = chat["choices"][0]
    response.ended(choice["finish_reason"])
    reasoning = choice["message"].get("reasoning_content") or ""
    response.usage = usage(chat["usage"], count(reasoning) if reasoning else 0)
    for key in EXTRAS:
        if key in chat:
            response.extras[key] = chat[key]
    return response.body(
        output_items(choice["message"], choice.get("logprobs"), choice["finish_reason"])
    )


class Events:
    """A chat stream's chunks as the Responses API's typed events, in order.

    Reasoning, text and calls each open their output item at their first piece and close
    it when another kind begins or the choice finishes; the chunk after the choices
    (`choices: []`, with the usage and `millm_steering`) ends the stream with
    `response.completed`, or `response.incomplete` when the output was cut at
    `max_output_tokens`.
    """

    def __init__(self, response: Response, count: Counter) -> None:
        self.response = response
        self.output: list[dict[str, Any]] = []
        self._count = count
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the item receiving pieces
        self._text: list[str] = []  # the open item's text so far
        self._entries: list[dict[str, Any]] = []  # the open message's token logprobs
        self._finish: str | None = None

    def event(self, kind: str, **members: Any) -> dict[str, Any]:
        out = {"type": kind, "sequence_number": self._seq, **members}
        self._seq += 1
        return out

    def started(self) -> Iterator[dict[str, Any]]:
        snapshot = self.response.body([])
        yield self.event("response.created", response=snapshot)
        yield self.event("response.in_progress", response=snapshot)

    def chunk(self, raw: dict[str, Any] | Encoded) -> Iterator[dict[str, Any]]:
        chunk = json.loads(raw.json) if isinstance(raw, Encoded) else raw
        choices = chunk.get("choices") or []
        if not choices:
            yield from self._trailer(chunk)
            return
        choice = choices[0]
        delta = choice.get("delta") or {}
        entries = token_logprobs((choice.get("logprobs") or {}).get("content"))
        if delta.get("reasoning_content"):
            yield from self._piece("reasoning", delta["reasoning_content"], [])
        if delta.get("content"):
            yield from self._piece("message", delta["content"], entries)
        elif entries and self._open is not None and self._open["type"] == "message":
            self._entries.extend(entries)  # tokens held back, reported with no text
        for call in delta.get("tool_calls") or ():
            yield from self._close()
            yield from self._call(call)
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
            yield from self._close()

    def _piece(
        self, kind: str, text: str, entries: list[dict[str, Any]]
    ) -> Iterator[dict[str, Any]]:
        if self._open is None or self._open["type"] != kind:
            yield from self._close()
            yield from self._opened(kind)
        self._text.append(text)
        where = {"item_id": self._open_id, "output_index": len(self.output), "content_index": 0}
        if kind == "reasoning":
            yield self.event("response.reasoning_text.delta", **where, delta=text)
            return
        self._entries.extend(entries)
        yield self.event("response.output_text.delta", **where, delta=text, logprobs=entries)

    @property
    def _open_id(self) -> str:
        assert self._open is not None
        return str(self._open["id"])

    def _opened(self, kind: str) -> Iterator[dict[str, Any]]:
        if kind == "reasoning":
            self._open = reasoning_item("", done=False)
            part = {"type": "reasoning_text", "text": ""}
        else:
            self._open = message_item([], "in_progress")
            part = text_part("", [])
        index = len(self.output)
        yield self.event("response.output_item.added", output_index=index, item=self._open)
        where = {"item_id": self._open_id, "output_index": index, "content_index": 0}
        yield self.event("response.content_part.added", **where, part=part)

    def _close(self) -> Iterator[dict[str, Any]]:
        if self._open is None:
            return
        text, index = "".join(self._text), len(self.output)
        where = {"item_id": self._open_id, "output_index": index, "content_index": 0}
        if self._open["type"] == "reasoning":
            item = reasoning_item(text, self._open_id)
            part: dict[str, Any] = item["content"][0]
            yield self.event("response.reasoning_text.done", **where, text=text)
        else:
            status = "incomplete" if self._finish == "length" else "completed"
            part = text_part(text, self._entries)
            item = message_item([part], status, self._open_id)
            yield self.event(
                "response.output_text.done", **where, text=text, logprobs=self._entries
            )
        yield self.event("response.content_part.done", **where, part=part)
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self._open, self._text, self._entries = None, [], []

    def _call(self, call: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        item = call_item(call)
        index = len(self.output)
        added = {**item, "arguments": "", "status": "in_progress"}
        yield self.event("response.output_item.added", output_index=index, item=added)
        where = {"item_id": item["id"], "output_index": index}
        arguments = item["arguments"]
        yield self.event("response.function_call_arguments.delta", **where, delta=arguments)
        yield self.event(
            "response.function_call_arguments.done", **where, name=item["name"], arguments=arguments
        )
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def _trailer(self, chunk: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """A `choices: []` chunk: the verdicts, the activations, or the last (usage and
        steering), which ends the stream."""
        for key in EXTRAS:
            if key in chunk:
                self.response.extras[key] = chunk[key]
        if "millm_steering" not in chunk:
            return
        yield from self._close()
        self.response.extras["millm_steering"] = chunk["millm_steering"]
        if chunk.get("usage") is not None:
            reasoning = "".join(
                part["text"]
                for item in self.output
                if item["type"] == "reasoning"
                for part in item["content"]
            )
            self.response.usage = usage(chunk["usage"], self._count(reasoning) if reasoning else 0)
        self.response.ended(self._finish)
        kind = "response.incomplete" if self.response.status == "incomplete" else None
        yield self.event(kind or "response.completed", response=self.final())

    def final(self) -> dict[str, Any]:
        return self.response.body(self.output)

    def failed(self, exc: ApiError) -> Iterator[dict[str, Any]]:
        """An `error` event, then `response.failed` with what was output before it."""
        yield self.event("error", code=exc.code, message=exc.message, param=exc.param)
        self.response.status = "failed"
        self.response.error = {"code": FAILED_CODE, "message": exc.message}
        yield self.event("response.failed", response=self.final())
