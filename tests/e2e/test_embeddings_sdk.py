"""`/v1/embeddings` through the official `openai` SDK, unchanged, against `miserver serve`.

The SDK asks for base64 itself when the caller names no `encoding_format`, and
decodes it into floats (numpy's float32 when installed); a caller who names a
format gets the response untouched.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest
from openai import OpenAI

from tests.conftest import MODEL_ID

pytestmark = pytest.mark.e2e

TEXTS = ["a", "b"]
WIDTH = 576


def floats(sdk: OpenAI) -> np.ndarray:
    reply = sdk.embeddings.create(model=MODEL_ID, input=TEXTS, encoding_format="float")
    return np.array([item.embedding for item in reply.data], dtype=np.float64)


def test_a_list_gives_one_vector_per_input(sdk: OpenAI) -> None:
    """OAI-EMB-01, OAI-EMB-03, OAI-INTEG: two inputs, two 576-wide float vectors in input
    order, `usage` counting every input token, the model echoed."""
    raw = sdk.embeddings.with_raw_response.create(
        model=MODEL_ID, input=TEXTS, encoding_format="float"
    )
    assert raw.headers["X-miLLM-Model"] == MODEL_ID
    assert "X-miLLM-Steering" not in raw.headers  # OAI-EMB-36
    reply = raw.parse()
    assert reply.object == "list" and reply.model == MODEL_ID
    assert [item.index for item in reply.data] == [0, 1]
    assert all(item.object == "embedding" for item in reply.data)
    assert [len(item.embedding) for item in reply.data] == [WIDTH, WIDTH]
    assert reply.data[0].embedding != reply.data[1].embedding
    assert reply.usage.prompt_tokens == reply.usage.total_tokens >= len(TEXTS)


def test_the_sdk_default_base64_decodes_to_the_floats(sdk: OpenAI) -> None:
    """OAI-EMB-03, OAI-EMB-04: with no `encoding_format` the SDK sends base64 and decodes it
    itself: the same vectors as the float format, within 1e-6."""
    raw = sdk.embeddings.with_raw_response.create(model=MODEL_ID, input=TEXTS)
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"
    decoded = np.array([item.embedding for item in raw.parse().data], dtype=np.float64)
    assert decoded.shape == (len(TEXTS), WIDTH)
    np.testing.assert_allclose(decoded, floats(sdk), rtol=0, atol=1e-6)


def test_explicit_base64_and_a_refused_field(sdk: OpenAI) -> None:
    """OAI-EMB-04, OAI-EMB-09: an explicit base64 comes back as strings of little-endian
    float32; `dimensions` (an SDK parameter) is 400 field_not_honoured."""
    reply = sdk.embeddings.create(model=MODEL_ID, input=TEXTS, encoding_format="base64")
    strings: list[object] = [item.embedding for item in reply.data]  # typed list[float]
    assert all(isinstance(s, str) for s in strings)
    decoded = np.array([np.frombuffer(base64.b64decode(str(s)), dtype="<f4") for s in strings])
    np.testing.assert_allclose(decoded, floats(sdk), rtol=0, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=MODEL_ID, input=TEXTS, dimensions=WIDTH)
    assert refused.value.code == "field_not_honoured"
    assert refused.value.param == "dimensions"
