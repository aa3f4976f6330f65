"""A conversation shortened to fit the window: the Responses API's `truncation: "auto"`.

OpenAI drops items from the beginning of the conversation until the input fits the
model's window. Here a conversation loses whole turns, oldest first: the leading system
(or developer) messages stay, and a turn is everything from one user message up to the
next, so what is left still opens on a user message with its tool results after their
calls (a template that checks the roles' order renders it). The last user turn is never
dropped: a conversation that does not fit without its older turns is refused as any
prompt past the window is (`context_length_exceeded`).
"""

from __future__ import annotations

from dataclasses import replace

from ...engines.base import ChatPrompt

KEPT = frozenset({"system", "developer"})  # leading messages a truncation never drops


def without_oldest_turn(prompt: ChatPrompt) -> ChatPrompt | None:
    """`prompt` less its oldest turn; None when only its last user turn is left."""
    messages = list(prompt.messages)
    head = 0
    while head < len(messages) and messages[head].get("role") in KEPT:
        head += 1
    later = [i for i in range(head + 1, len(messages)) if messages[i].get("role") == "user"]
    if not later:
        return None
    return replace(prompt, messages=(*messages[:head], *messages[later[0] :]))
