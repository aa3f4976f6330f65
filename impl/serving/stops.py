"""Stop sequences over streamed text, with hold-back (OAI-CHAT-20).

`StopMatcher.push` releases text as soon as it cannot be the start of a stop
sequence and holds back the rest. When a stop sequence completes, the text
before it is released and the stop string and everything after it are
dropped (OpenAI leaves the stop string out of the answer).

The stop that counts is the first to complete, the longest of those when
several complete together. For any split of a text into chunks the released
text is the same. When no stop string contains another, this is the text
cut at the first occurrence of any stop; when one does (stops `abcd` and
`bc` over `abcd`), the inner one completes first and wins, because a stream
must stop as soon as a stop sequence is complete (OAI-STREAM-07).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Cuts a stream of text at the first stop sequence to complete."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(stop for stop in stops if stop))
        self._held = ""
        self.matched: str | None = None  # the stop sequence that ended the text, once one has

    @property
    def watching(self) -> bool:
        """Whether any stop sequence is watched for (empty ones are not)."""
        return bool(self._stops)

    @property
    def stopped(self) -> bool:
        """Whether a stop sequence has matched."""
        return self.matched is not None

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to release now, and whether a stop sequence matched."""
        if self.matched is not None:
            return "", True
        buffer = self._held + text
        found = _first(buffer, self._stops)
        if found is not None:
            self._held = ""
            self.matched = found[1]
            return buffer[: found[0]], True
        keep = held_tail(buffer, self._stops)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The text held back at the end of the stream."""
        held, self._held = self._held, ""
        return held


def held_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of `text` that may begin one of `markers` (0: none): what
    a stream holds back until it knows (stops; tool-call and reasoning markers)."""
    longest = max((len(marker) for marker in markers), default=1)
    for length in range(min(len(text), longest - 1), 0, -1):
        tail = text[-length:]
        if any(marker.startswith(tail) for marker in markers):
            return length
    return 0


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop to complete in `text` starts, or None."""
    found = _first(text, stops)
    return None if found is None else found[0]


def _first(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The first stop to complete in `text` (the longest of those completing together) and
    where it starts, or None."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop) if stop else -1
        if start >= 0:
            candidate = (start + len(stop), start, stop)
            best = candidate if best is None else min(best, candidate)
    return None if best is None else (best[1], best[2])
