"""Response bodies and stream chunks (serving/completions/shapes.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miserver.serving.completions import shapes

FINGERPRINT = "millm:m@r:float32/none:transformers"
USAGE = shapes.usage(5, 3)


def stream(endpoint: str, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks of a two-prompt stream, as the service sends them."""
    out = shapes.Envelope.new(endpoint, "m").chunks(FINGERPRINT, include_usage)
    chunks = []
    for i in range(2):
        chunks.append(out.content([shapes.delta(endpoint, i, "Hi", None)]))
        finish = [shapes.delta(endpoint, i, None, "stop")]
        chunks.append(out.finish(finish, USAGE if i == 1 else None))
    return [*chunks, out.last("none", USAGE)]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_with_include_usage_only_the_last_chunk_has_usage(endpoint: str) -> None:
    """OAI-STREAM-05, OAI-STREAM-08, OAI-STREAM-10: usage non-null on exactly one chunk, the last,
    which has choices [] and millm_steering; every other chunk says `"usage": null`."""
    *rest, last = stream(endpoint, include_usage=True)
    assert all("usage" in c and c["usage"] is None for c in rest)
    assert last["choices"] == [] and last["usage"] == USAGE and last["millm_steering"] == "none"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_without_include_usage_the_last_finish_chunk_has_it(endpoint: str) -> None:
    """OAI-STREAM-05: usage on the request's last finish chunk, no other chunk has the member."""
    chunks = stream(endpoint, include_usage=False)
    assert [i for i, c in enumerate(chunks) if "usage" in c] == [3]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop" and chunks[3]["usage"] == USAGE
    assert chunks[-1] == {
        **{k: chunks[0][k] for k in ("id", "object", "created", "model", "system_fingerprint")},
        "choices": [],
        "millm_steering": "none",
    }


@pytest.mark.parametrize("include_usage", [True, False])
def test_every_chunk_shares_the_envelope(include_usage: bool) -> None:
    """OAI-STREAM-03, OAI-STREAM-08: one id, object, created (never 0), model and
    system_fingerprint on every chunk, the steering chunk included."""
    chunks = stream("chat", include_usage)
    keys = ("id", "object", "created", "model", "system_fingerprint")
    assert len({tuple(c[k] for k in keys) for c in chunks}) == 1
    assert chunks[0]["created"] > 0 and chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["system_fingerprint"] == FINGERPRINT


def test_chat_messages_say_refusal_null() -> None:
    """OAI-RESP-05: every chat message has `refusal: null` (OpenAI's schema requires the key);
    a text completion's choice has no message."""
    chat = shapes.choice("chat", 0, "Hello", "stop")
    assert chat["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert "message" not in shapes.choice("completions", 0, "Hello", "stop")


TEXTS = [
    "Hi",
    "",
    " history",
    'quote " and \\ back',
    "line\nbreak\ttab",
    "é😀中",
    "\x00\x1f\x7f",
    "\u2028",
]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_text_chunk_is_the_characters_its_dict_would_be(
    endpoint: str, include_usage: bool
) -> None:
    """OAI-STREAM-01: the per-token chunk made from its stream's template (`Chunks.text`) is,
    character for character, the JSON of the chunk `content` builds, for every choice index
    and any text (escapes, control characters, non-ASCII)."""
    out = shapes.Envelope.new(endpoint, "m").chunks(FINGERPRINT, include_usage)
    for index in (0, 1, 12):
        for text in TEXTS:
            whole = out.content([shapes.delta(endpoint, index, text, None)])
            assert out.text(index, text).json == json.dumps(whole, ensure_ascii=False)
