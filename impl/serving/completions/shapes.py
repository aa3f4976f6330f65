"""OpenAI response bodies and stream chunks, as plain dicts (OAI-RESP, OAI-STREAM, OAI-CMPL)."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ...engines.base import ModelFacts
from ..results import Encoded

OBJECTS = {
    "chat": ("chatcmpl-", "chat.completion", "chat.completion.chunk"),
    "completions": ("cmpl-", "text_completion", "text_completion"),
}


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every body and chunk of one response shares."""

    endpoint: str
    id: str
    created: int
    model: str

    @staticmethod
    def new(endpoint: str, model: str) -> Envelope:
        prefix = OBJECTS[endpoint][0]
        return Envelope(endpoint, prefix + secrets.token_hex(12), int(time.time()), model)

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def body(
        self, choices: list[dict[str, Any]], usage: dict[str, int], fingerprint: str
    ) -> dict[str, Any]:
        head = self.head(OBJECTS[self.endpoint][1])
        return {**head, "system_fingerprint": fingerprint, "choices": choices, "usage": usage}

    def chunks(self, fingerprint: str, include_usage: bool, continuous: bool = False) -> Chunks:
        """The chunks of a stream that shares this envelope (OAI-STREAM)."""
        return Chunks(self, fingerprint, include_usage, continuous)


_MARK = "\u0000text\u0000"  # stands for a chunk's text while its template is made
_MARK_JSON = json.dumps(_MARK)  # no id, model or fingerprint holds it: JSON escapes NUL


@dataclass(frozen=True, slots=True)
class Chunks:
    """Every chunk of one stream, each with the same id, created, model and fingerprint.

    `usage` is on one chunk only. With `include_usage` it is on the last one,
    the `choices: []` chunk that also carries `millm_steering` (OpenAI's usage
    chunk and the steering chunk are one), and every earlier chunk says
    `"usage": null`; without it, the request's last finish chunk carries it
    (OAI-STREAM-05) and no other chunk has the member. With `continuous` (vLLM's
    `continuous_usage_stats`, contract 0.18.0) every chunk of a choice carries the usage as
    it stands then (`so_far`) instead of null.
    """

    envelope: Envelope
    fingerprint: str
    include_usage: bool
    continuous: bool = False
    # per choice index, the JSON text of its text chunk before and after the text
    _around: dict[int, tuple[str, str]] = field(default_factory=dict, compare=False, repr=False)

    def _chunk(
        self, choices: list[dict[str, Any]], so_far: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        env = self.envelope
        head = env.head(OBJECTS[env.endpoint][2])
        chunk = {**head, "system_fingerprint": self.fingerprint, "choices": choices}
        if self.include_usage:
            chunk["usage"] = so_far if self.continuous else None
        return chunk

    def content(
        self, choices: list[dict[str, Any]], so_far: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A chunk of role, text or calls: usage only when `continuous` (`so_far`)."""
        return self._chunk(choices, so_far)

    def text(self, index: int, text: str) -> Encoded:
        """`content([delta(endpoint, index, text, None)])` as JSON text, the same characters
        `json.dumps(..., ensure_ascii=False)` writes for it: one string encoded per token,
        the rest made once per choice."""
        around = self._around.get(index)
        if around is None:
            whole = json.dumps(self.content([delta(self.envelope.endpoint, index, _MARK, None)]),
                               ensure_ascii=False)  # fmt: skip
            before, after = whole.split(_MARK_JSON)
            around = self._around[index] = (before, after)
        return Encoded(around[0] + json.dumps(text, ensure_ascii=False) + around[1])

    def finish(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        so_far: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A choice's finish chunk; `usage` (the whole request's, given on the request's
        last finish chunk) rides on it unless the last chunk carries it; `so_far`, when
        `continuous`."""
        chunk = self._chunk(choices, so_far)
        if usage is not None and not self.include_usage:
            chunk["usage"] = usage
        return chunk

    def millm(self, millm: dict[str, Any]) -> dict[str, Any]:
        """A `choices: []` chunk carrying the `millm` object (the request's activations,
        OAI-ACT-14): after the choices' chunks, before the last."""
        chunk = self._chunk([])
        chunk["millm"] = millm
        return chunk

    def verdicts(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """A `choices: []` chunk carrying `millm_probe_verdicts` (OAI-PROBE-08): after the
        choices' chunks, before the activations and the last."""
        chunk = self._chunk([])
        chunk["millm_probe_verdicts"] = results
        return chunk

    def last(self, steering: str, usage: dict[str, Any]) -> dict[str, Any]:
        """The last chunk before `[DONE]`: `choices: []`, `millm_steering` (OAI-STREAM-08,
        OAI-STREAM-10) and, with `include_usage`, the whole request's usage."""
        chunk = self._chunk([])
        if self.include_usage:
            chunk["usage"] = usage
        chunk["millm_steering"] = steering
        return chunk


def choice(
    endpoint: str,
    index: int,
    text: str | None,
    finish_reason: str,
    *,
    calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice; a chat reply with `calls` carries them as `tool_calls` (OAI-TOOLS-04),
    and `logprobs` its reported tokens (logprobs.py) when the request asked for them.

    A chat message always has `refusal: null`: OpenAI's schema requires the key,
    and nothing here refuses.
    """
    if endpoint == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    return {
        "index": index,
        "text": text or "",
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def with_stop(choice: dict[str, Any], stop: str | None) -> dict[str, Any]:
    """`choice` with vLLM's `stop_reason` when a stop sequence ended it (the sequence; the
    member is absent otherwise): the Messages API's `stop_sequence` reads it."""
    if stop is not None and choice["finish_reason"] == "stop":
        choice["stop_reason"] = stop
    return choice


def delta(
    endpoint: str,
    index: int,
    text: str | None,
    finish_reason: str | None,
    *,
    role: bool = False,
    calls: list[dict[str, Any]] | None = None,
    reasoning: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice's chunk; a chat delta carries `reasoning_content` when given (LOC-CHAT-57),
    and `logprobs` the tokens reported with the chunk (logprobs.py)."""
    if endpoint == "chat":
        d: dict[str, Any] = {"role": "assistant"} if role else {}
        if reasoning is not None:
            d["reasoning_content"] = reasoning
        if text is not None:
            d["content"] = text
        if calls:
            d["tool_calls"] = calls
        return {"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish_reason}
    return {
        "index": index,
        "text": text or "",
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens` counts prompt tokens the KV cache already held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def fingerprint(facts: ModelFacts) -> str:
    """`millm:<model>@<revision>:<dtype>/<quantization>:<engine>` (OAI-SEED-14).

    A part the server does not know is written `unrecorded` (OAI-SEED-16).
    """
    parts = [facts.model_id, facts.revision, facts.dtype, facts.quantization, facts.engine]
    m, rev, dtype, quant, engine = (p or "unrecorded" for p in parts)
    return f"millm:{m}@{rev}:{dtype}/{quant}:{engine}"
