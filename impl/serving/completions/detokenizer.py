"""Incremental detokenization: token ids in, newly complete text out.

A token may end in the middle of a multi-byte UTF-8 character, which a
decoder renders as U+FFFD; such text is held back until the character is
complete. Decoding a token alone can also differ from decoding it after its
neighbours (leading-space rules), so each step decodes a short window: the
ids from `prefix` on, and releases what that window decodes to beyond the
ids from `prefix` to `read` (the offsets scheme of TGI and vLLM). Each step
costs the window, not the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"

Decode = Callable[[Sequence[int]], str]


class Detokenizer:
    """Turns a stream of token ids into a stream of text."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes (often empty while held)."""
        self._ids.append(token_id)
        delta = self._delta()
        if not delta or delta.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """Whatever is still held at the end, incomplete characters included."""
        delta = self._delta()
        self._prefix = self._read = len(self._ids)
        return delta

    def _delta(self) -> str:
        window = self._ids[self._prefix :]
        known = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(window)
        return text[len(known) :] if len(text) > len(known) else ""
