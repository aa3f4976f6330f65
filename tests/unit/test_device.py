"""Where the transformers engine runs (issue 48): the device and type a session asks for,
resolved on this CPU machine; the copies made once to a model's device (steering vectors,
SAEs, probe weights, prompt-cache entries), run here on the CPU and, for the branch that
copies, on torch's `meta` device (a device with no storage: the copy's own code path
without a GPU); and a pass that runs a device out of memory answered as the seed's typed
refusal (OAI-ERR-28, OAI-SCORE-31)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from miserver.engines.base import SamplingParams
from miserver.engines.memory import ran_out
from miserver.engines.prompt_cache import MIN_TOKENS, PromptCache
from miserver.engines.transformers.decoding import Sampler, pick_rows
from miserver.engines.transformers.device import (
    DeviceUnavailable,
    describe,
    resolve_device,
    resolve_dtype,
)
from miserver.engines.transformers.prefix import Held, copied, kv_cache, stored
from miserver.engines.transformers.steering import Placed
from miserver.errors import fault
from miserver.probes.watch import OnDevice
from miserver.steering.sae import load_sae, placed
from tests.saes import cfg_for, weights_for, write_sae

CPU, META = torch.device("cpu"), torch.device("meta")
CONFIG = LlamaConfig(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=64,
)


def test_auto_is_the_cpu_here_and_a_gpu_it_cannot_see_is_refused_by_name() -> None:
    """`auto` is the first CUDA device, else the CPU; `cuda`/`cuda:N` this process cannot see
    and a word that is no device are refused, naming the device."""
    assert not torch.cuda.is_available()  # this machine: the CPU build of torch
    assert resolve_device("auto") == CPU == resolve_device("cpu")
    for wanted in ("cuda", "cuda:1"):
        with pytest.raises(DeviceUnavailable, match=wanted):
            resolve_device(wanted)
    for wanted in ("gpu", "cuda:x"):
        with pytest.raises(DeviceUnavailable, match="none of auto, cpu, cuda"):
            resolve_device(wanted)
    assert describe(CPU) == "the CPU"


@pytest.mark.parametrize(
    ("wanted", "stored", "expected"),
    [
        ("auto", torch.bfloat16, torch.float32),  # the CPU computes in float32
        ("auto", None, torch.float32),
        ("bfloat16", torch.float32, torch.bfloat16),  # the person's choice stands
        ("float16", None, torch.float16),
    ],
)
def test_the_type_on_the_cpu(
    wanted: str, stored: torch.dtype | None, expected: torch.dtype
) -> None:
    assert resolve_dtype(wanted, CPU, stored) == expected


def test_a_steering_vector_is_placed_once_per_device_and_type() -> None:
    """A snapshot's host float32 vector is copied to the hidden states' device and type once
    (the same tensor every pass after), and not at all where it already is."""
    place = Placed()
    vector = torch.randn(16)
    assert place(vector, torch.zeros(2, 16)) is vector  # float32 on the CPU: no copy
    half = place(vector, torch.zeros(2, 16, dtype=torch.bfloat16))
    assert half.dtype == torch.bfloat16 and torch.equal(half, vector.to(torch.bfloat16))
    assert place(vector, torch.zeros(1, dtype=torch.bfloat16)) is half
    moved = place(vector, torch.empty(2, 16, device=META))
    assert moved.device == META and place(vector, torch.empty(1, device=META)) is moved
    for _ in range(Placed.KEEP + 1):  # bounded: the oldest copies go
        place(torch.randn(16), torch.zeros(1, dtype=torch.bfloat16))
    assert len(place._made) == Placed.KEEP


def test_an_sae_is_placed_once_on_a_device(tmp_path: Path) -> None:
    """Readings encode where the model's rows are: the SAE's weights are copied there once
    (itself on its own device), thresholds included."""
    sae = load_sae(write_sae(tmp_path / "j", cfg_for("jumprelu"), weights_for("jumprelu")))
    assert placed(sae, CPU) is sae
    there = placed(sae, META)
    assert there is placed(sae, META) and there.sae_id == sae.sae_id
    assert {t.device for t in (there.W_enc, there.W_dec, there.b_enc, there.b_dec)} == {META}
    assert there.threshold is not None and there.threshold.device == META
    assert sae.W_enc.device == CPU  # the registry's copy is untouched


def _held(length: int, device: torch.device = CPU) -> Held:
    cache = DynamicCache(config=CONFIG)
    keys = torch.randn(1, 1, length, 8)
    for layer in range(CONFIG.num_hidden_layers):
        cache.update(keys.to(device), keys.to(device) + 1, layer)
    return Held(cache, ids=list(range(length)), key=("k",))


def test_a_cache_is_copied_to_the_device_asked_and_stored_on_the_host() -> None:
    """A prompt-cache entry is kept in host memory and restored where the model is: `copied`
    makes new tensors on the device asked (the `meta` copy runs the branch a GPU takes), and
    `stored` copies a cache on another device to the host, keeping one on the host as is."""
    held = _held(6)
    same = copied(held, 4, CONFIG)
    keys = same.cache.layers[0].keys
    assert keys is not None and keys.shape[2] == 4 and same.ids == [0, 1, 2, 3]
    assert keys.data_ptr() != held.cache.layers[0].keys.data_ptr()  # type: ignore[union-attr]
    there = copied(held, 4, CONFIG, META)
    assert {layer.keys.device for layer in there.cache.layers} == {META}  # type: ignore[union-attr]
    long = _held(MIN_TOKENS + 2)
    store = PromptCache(budget=1 << 30)
    stored(store, long, CONFIG)
    found = store.best([*long.ids, 9], ("k",))
    assert found is not None and found.entry.state is long  # on the host: kept, not copied


def test_running_a_device_out_of_memory_is_insufficient_memory() -> None:
    """OAI-ERR-28, OAI-SCORE-31: a pass that ran a card out of memory is `503
    insufficient_memory` (type `invalid_request_error`) naming the card; the host's
    MemoryError too; any other fault stays `internal_error`."""
    oom = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    )
    assert ran_out(oom) == "GPU 0"  # this CPU build cannot name it further
    refused = fault(oom)
    assert (refused.status, refused.code, refused.type) == (
        503,
        "insufficient_memory",
        "invalid_request_error",
    )
    assert "GPU 0" in refused.message
    assert "the host" in fault(MemoryError()).message
    assert fault(RuntimeError("boom")).code == "internal_error"


def test_the_cache_reaches_a_model_by_the_keyword_its_forward_takes() -> None:
    """transformers 5.2x names the KV cache `cache`; earlier 5.x releases (the GPU machine's
    5.17) take `past_key_values` and pass an unknown `cache` on to attention, which ignores
    it: the engine hands it by the name the model's forward takes."""

    class Older:
        def forward(self, input_ids: Any = None, past_key_values: Any = None) -> None: ...

    class Newer:
        def forward(self, input_ids: Any = None, cache: Any = None) -> None: ...

    kept = DynamicCache(config=CONFIG)
    assert kv_cache(Older(), kept) == {"past_key_values": kept}  # type: ignore[arg-type]
    assert kv_cache(Newer(), kept) == {"cache": kept}  # type: ignore[arg-type]


def _sampler(**params: Any) -> Sampler:
    return Sampler(SamplingParams(max_tokens=1, **params), None, None)


def test_greedy_under_bans_picks_on_the_device_as_on_the_host() -> None:
    """A greedy row whose bias only bans (`ignore_eos`) picks by an argmax where its logits
    are, with the banned ids at -inf, as the host path does; a row that samples or reports
    logprobs reads a host copy. Each row of a batch picks as it would alone."""
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0], [3.0, 1.0, 2.0, 0.0], [1.0, 2.0, 9.0, 3.0]])
    banned = _sampler(temperature=0, logit_bias=((1, -100.0),))
    plain = _sampler(temperature=0)
    reporting = _sampler(temperature=0, logprobs=1)
    assert banned.plain and banned.bans and plain.plain and not reporting.plain
    assert banned.pick(logits[0].clone()) == (2, None)  # 1 is banned: the next best
    picks = pick_rows(logits.clone(), [banned, plain, reporting])
    assert [token for token, _ in picks] == [2, 0, 2]
    assert picks[2][1] is not None and picks[2][1].logprob < 0  # reported, on the host
    host = _sampler(temperature=0, logit_bias=((1, -100.0), (3, 5.0)))  # adds: not plain
    assert not host.plain and host.pick(logits[0].clone())[0] == 3


def test_the_type_on_a_gpu_needs_no_gpu_to_decide_from_the_checkpoint() -> None:
    """On a CUDA device `auto` keeps a half checkpoint's type (float16 asks nothing of the
    card) and a named type stands: decided here from the device's name alone."""
    cuda = torch.device("cuda", 0)
    assert resolve_dtype("auto", cuda, torch.float16) == torch.float16
    assert resolve_dtype("float32", cuda, torch.bfloat16) == torch.float32
    assert resolve_dtype("float16", cuda, None) == torch.float16


def test_a_probe_s_weights_are_copied_once_to_each_device() -> None:
    """A probe's weights follow the rows to the model's device, copied once there."""
    weight = OnDevice(torch.ones(4))
    assert weight.on(CPU) is weight.on(CPU)
    there = weight.on(META)
    assert there.device == META and weight.on(META) is there
