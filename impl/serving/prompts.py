"""A completion's prompts and an embedding's inputs, as sent: text or token ids.

`entries()` reads `prompt` (completions) or `input` (embeddings) into its
entries before any load, refusing an empty list or a negative id;
`check_ids()` refuses, once the model is known, an id outside its vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..engines.base import ChatPrompt
from ..errors import InvalidParameter


@dataclass(frozen=True, slots=True)
class TextPrompt:
    text: str
    add_special_tokens: bool


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A prompt sent as token ids: it reaches the engine as it is, never tokenized.

    `where` is its place in the body (`prompt` for an `int[]`, `prompt[i]` in an
    `int[][]`); an id outside the vocabulary is named `{where}[j]`.
    """

    ids: tuple[int, ...]
    where: str

    def checked(self, vocab_size: int) -> list[int]:
        """The ids, once each is known to be below the model's vocabulary size."""
        check_ids(self.ids, self.where, vocab_size)
        return list(self.ids)


Prompt = ChatPrompt | TextPrompt | TokenPrompt
Entry: TypeAlias = str | tuple[int, ...]  # one `prompt` or `input` entry: text or token ids


def value_of(raw: Any) -> Any:
    """A generated RootModel's value, or the value itself."""
    return getattr(raw, "root", raw)


def entries(raw: Any, name: str) -> tuple[list[Entry], bool]:
    """`prompt` or `input` (`name`): a string, strings, token ids or token-id lists, as its
    entries, and whether it was a single one (a string or one id list), whose `param` is
    then the field itself (`prompt`, `prompt[j]`) rather than an entry (`prompt[i][j]`).

    Refused before any load: an empty list, an empty id list, a negative id.
    """
    value = value_of(raw)
    if isinstance(value, str):
        return [value], True
    items = [value_of(item) for item in value]
    if not items:
        raise InvalidParameter(name, f"{name} is empty: send a string or a non-empty list.")
    if isinstance(items[0], int):
        return [_ids(items, name)], True
    return [
        item if isinstance(item, str) else _ids(item, f"{name}[{i}]")
        for i, item in enumerate(items)
    ], False


def _ids(raw: Sequence[int], where: str) -> tuple[int, ...]:
    if not raw:
        raise InvalidParameter(where, f"{where} is an empty list of token ids.")
    ids = tuple(raw)
    check_ids(ids, where, None)
    return ids


def check_ids(ids: Sequence[int], where: str, vocab_size: int | None) -> None:
    """Refuse a negative id, or (once the model is known) one not below `vocab_size`,
    naming it `{where}[j]`."""
    top = math.inf if vocab_size is None else vocab_size
    if min(ids) >= 0 and max(ids) < top:
        return
    j, bad = next((j, i) for j, i in enumerate(ids) if not 0 <= i < top)
    known = "" if vocab_size is None else f" (0..{vocab_size - 1})"
    raise InvalidParameter(
        f"{where}[{j}]", f"{where}[{j}] is token id {bad}, outside the model's vocabulary{known}."
    )
