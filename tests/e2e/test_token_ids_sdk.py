"""Token-id inputs through the official `openai` SDK, unchanged, against `miserver serve`.

The SDK types `prompt` and `input` as OpenAI's schema does (a string, strings, token
ids or token-id lists); the ids here come from SmolLM2's own tokenizer, loaded apart
from the server.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest
from openai import OpenAI
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from miserver.engines.transformers.conversion import cached_hf_folder
from miserver.models.registry import embedded_default
from tests.conftest import MODEL_ID, cache_dir

pytestmark = pytest.mark.e2e

TEXTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    folder = cached_hf_folder(embedded_default(), cache_dir(), lambda _: None)
    found: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(folder)
    return found


def test_completions_take_token_id_lists(sdk: OpenAI, tokenizer: PreTrainedTokenizerBase) -> None:
    """Issue 15 item 4, OAI-CMPL-02, OAI-INTEG: `prompt=[[...], [...]]` gives one choice per
    id list, each the greedy completion of the text those ids stand for."""
    ids = [tokenizer.encode(t) for t in TEXTS]
    by_text = sdk.completions.create(model=MODEL_ID, prompt=TEXTS, max_tokens=6, temperature=0)
    by_ids = sdk.completions.create(model=MODEL_ID, prompt=ids, max_tokens=6, temperature=0)
    assert [c.index for c in by_ids.choices] == [0, 1]
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == sum(len(i) for i in ids)
    one = sdk.completions.create(model=MODEL_ID, prompt=ids[0], max_tokens=6, temperature=0)
    assert [c.text for c in one.choices] == [by_text.choices[0].text]


def test_an_id_outside_the_vocabulary_raises_bad_request(sdk: OpenAI) -> None:
    """Issue 15 item 4, OAI-ERR-01: the SDK raises BadRequestError carrying the code and the
    `param` naming the id."""
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model=MODEL_ID, prompt=[[1, 2], [3, 10**6]], max_tokens=2)
    assert refused.value.code == "invalid_parameter"
    assert refused.value.param == "prompt[1][1]"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=MODEL_ID, input=[1, 2, 10**6])
    assert refused.value.param == "input[2]"


def test_embeddings_take_token_ids(sdk: OpenAI, tokenizer: PreTrainedTokenizerBase) -> None:
    """Issue 15 item 4, OAI-EMB-01, OAI-INTEG: `input=[1, 2, 3]` is one input and
    `input=[[...], [...]]` one per list; the vectors (the SDK's default base64, decoded)
    equal those of the texts the ids stand for."""
    raw = sdk.embeddings.create(model=MODEL_ID, input=[1, 2, 3])
    assert len(raw.data) == 1 and raw.usage.prompt_tokens == 3
    ids = [tokenizer.encode(t) for t in TEXTS]
    by_ids = sdk.embeddings.create(model=MODEL_ID, input=ids)
    by_text = sdk.embeddings.create(model=MODEL_ID, input=TEXTS)
    found = np.array([d.embedding for d in by_ids.data], dtype=np.float64)
    expected = np.array([d.embedding for d in by_text.data], dtype=np.float64)
    assert found.shape == (2, 576)
    np.testing.assert_array_equal(found, expected)
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == sum(len(i) for i in ids)
