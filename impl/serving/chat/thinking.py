"""Thinking on or off for one chat request (docs/DECISIONS.md, thinking).

Most specific first: the request's own `think`, then
`chat_template_kwargs.enable_thinking`, then `reasoning_effort` (`"none"`
turns thinking off, any other value on), then the server's default (the
`think` parameter). The answer reaches the chat template as
`enable_thinking`, beside whatever else the request put in
`chat_template_kwargs`; a template that reads no such variable is unchanged.

A reply held to a grammar from its first token (a JSON `response_format`, a
forced tool call) is rendered with thinking off: reasoning is never
constrained (LOC-CHAT-40), and a constrained reply has no room for it.

A field that had no effect is reported as unused (X-miLLM-Ignored-Fields;
refused in strict mode): one a more specific field overrode, and under a
constraint the one that asked for thinking. Both engines honour `think` and
`reasoning_effort`, so one model file renders alike on both (OAI-TOKIDS-01);
where `chat_template_kwargs` is not honoured (GGUF: OAI-GGUF-10) its
`enable_thinking` takes no part, and the policy reports it with the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InvalidParameter

KEY = "enable_thinking"
KWARG = f"chat_template_kwargs.{KEY}"


@dataclass(frozen=True, slots=True)
class ThinkAsk:
    """The fields that turn a chat's thinking on or off, as sent (None: not sent).

    `enable_thinking` is `chat_template_kwargs.enable_thinking`, checked to be a
    boolean only where chat_template_kwargs is honoured (serving/chat/thinking.py).
    """

    think: bool | None = None
    enable_thinking: Any = None
    reasoning_effort: str | None = None


@dataclass(frozen=True, slots=True)
class Thinking:
    """Whether the chat is rendered thinking, and the request field that decided it
    (None: the server's default)."""

    enabled: bool
    source: str | None = None


def think_setting(
    think: bool | None,
    enable_thinking: bool | None,
    reasoning_effort: str | None,
    think_default: bool,
) -> Thinking:
    """The precedence itself: the first of the request's three that is set, else the default."""
    if think is not None:
        return Thinking(think, "think")
    if enable_thinking is not None:
        return Thinking(enable_thinking, KWARG)
    if reasoning_effort is not None:
        return Thinking(reasoning_effort != "none", "reasoning_effort")
    return Thinking(think_default)


def _asked(ask: ThinkAsk, kwargs_honoured: bool) -> dict[str, Any]:
    """The request's three fields, most specific first, by location; null ones left out,
    and `enable_thinking` too where `chat_template_kwargs` is not honoured."""
    enable = ask.enable_thinking if kwargs_honoured else None
    if enable is not None and not isinstance(enable, bool):
        raise InvalidParameter(KWARG, f"{KWARG} must be a boolean (or absent).")
    sent = {"think": ask.think, KWARG: enable, "reasoning_effort": ask.reasoning_effort}
    return {where: value for where, value in sent.items() if value is not None}


def settle(
    ask: ThinkAsk,
    think_default: bool,
    *,
    constrained: bool,
    kwargs_honoured: bool = True,
) -> tuple[bool, list[str]]:
    """Whether a chat renders thinking, and the fields of `ask` that had no effect.

    A field a more specific one overrode had none; under a constraint
    thinking is off, so the field that asked for it had none either.
    """
    sent = _asked(ask, kwargs_honoured)
    decided = think_setting(
        sent.get("think"), sent.get(KWARG), sent.get("reasoning_effort"), think_default
    )
    unused = [where for where in sent if where != decided.source]
    if constrained and decided.enabled:
        return False, [*unused, *([] if decided.source is None else [decided.source])]
    return decided.enabled, unused
