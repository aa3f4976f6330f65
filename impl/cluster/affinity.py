"""Where a request would find its prompt already computed, read from its body alone.

The ingress runs no model, so it has no tokens to compare: it reads a prompt as
pieces (a chat's messages, a Responses input's items, a text prompt in blocks of
`BLOCK_CHARS` characters) and chains a hash over them under the model and what
comes before the messages (tools, instructions): `prefix[i]` stands for the
first i + 1 pieces. A second turn repeats its first turn's messages, so its
first hashes are the first turn's, and the router (router.py) finds the replica
that served the first turn, whose prompt cache holds that prefix, by the deepest
hash it remembers.

`steering` is a hash of what the body asks of steering (its own `steering`,
`profile`, `steering_intensity` or circuit fields): rows under one steering set
batch together on a replica, and a replica already running that set restores
its prefixes (a steered prefix is cached under its steering key).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

BLOCK_CHARS = 256  # a text prompt's piece
BLOCK_IDS = 64  # a prompt of token ids: its piece
MAX_PIECES = 64  # deeper than this, a prompt's place is already decided
STEERING_FIELDS = ("steering", "profile", "steering_intensity", "circuit", "circuits")
# what comes before the messages in a rendered prompt
HEAD_FIELDS = ("model", "tools", "instructions", "system")


@dataclass(frozen=True, slots=True)
class Affinity:
    """What the router places a request by: its prompt's chained hashes, shortest first,
    and its steering set's hash ("" when it asks nothing of steering)."""

    prefix: tuple[str, ...] = ()
    steering: str = ""


NONE = Affinity()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _blocks(text: str) -> Iterator[str]:
    for at in range(0, len(text), BLOCK_CHARS):
        yield text[at : at + BLOCK_CHARS]


def _pieces(body: Mapping[str, Any]) -> Iterator[Any]:
    """The prompt's pieces, in the order a template renders them."""
    if isinstance(body.get("messages"), list):  # chat completions, Anthropic messages
        yield from body["messages"]
        return
    prompt = body.get("input") if "input" in body else body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
        prompt = prompt[0]  # several prompts: the first places the request
    if isinstance(prompt, str):
        yield from _blocks(prompt)
    elif isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        for at in range(0, len(prompt), BLOCK_IDS):
            yield prompt[at : at + BLOCK_IDS]
    elif isinstance(prompt, list):  # Responses input items
        yield from prompt


def affinity(body: Any) -> Affinity:
    """The request's affinity; NONE for a body that holds no prompt."""
    if not isinstance(body, Mapping):
        return NONE
    asked = {k: body[k] for k in STEERING_FIELDS if k in body}
    steering = hashlib.sha256(_canonical(asked)).hexdigest()[:16] if asked else ""
    chain = hashlib.sha256(_canonical({k: body.get(k) for k in HEAD_FIELDS}))
    prefix: list[str] = []
    for piece in _pieces(body):
        if len(prefix) == MAX_PIECES:
            break
        chain = hashlib.sha256(chain.digest() + _canonical(piece))
        prefix.append(chain.hexdigest()[:16])
    return Affinity(tuple(prefix), steering)
