"""The one llama.cpp context of an engine: its KV cache and the ids it holds.

The context is kept across requests (LOC-CHAT-43). `Context.hold(ids)`
makes the KV cache hold exactly `ids`: it keeps the longest prefix the cache
already holds (at most `len(ids) - 1` tokens, so the last one is always run
and its logits are fresh), drops the rest, and runs what is missing. The
count it returns is what was really reused: `Prefilled.cached_tokens`. A
different conversation evicts the previous one: there is one cache.

The ids the cache holds are llama-cpp-python's own record (`Llama.input_ids`
up to `Llama.n_tokens`), kept in step with the cache here (and by
`Llama.eval`, which decisions use). Tokens run through llama.cpp's batch
API directly: a prefill in chunks of n_batch with logits for the last token
only, and each generated token through a one-token `llama_batch` made once,
so a decode step writes two numbers into it, calls `llama_decode` and
records the id (`Llama.eval` would also trim the cache and refill the whole
batch, every step). The logits stay in llama.cpp's buffer: the sampler
(sampling.py: an argmax in place at temperature 0, else llama.cpp's chain)
reads them there, as penalties and grammar masks write them (`pick`).
A generator owns the context between its steps; when another generator has
used it meanwhile (generators interleaved), the next step re-holds its own
sequence through the same prefix reuse, so the two never mix. (A sequence
re-run in one batch may differ from its token-by-token run in the last bits
of the logits, as any reused prefix may from a fresh prefill.) Each step
runs under a lock; nothing is held across a `yield`. A seeded request holds
with `reuse=False`: whatever it must run again, it runs from the first
token, so its logits never depend on what an earlier request left.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import NoReturn

import llama_cpp
import numpy as np
import torch

from ..base import Logprobs, Scored, ScoreQuery, SteeringSource, Token
from ..logprobs import of_rows, scored
from ..prompt_cache import PromptCache
from .batches import fill
from .sampling import Logits, Picking
from .states import States
from .steering import MIXED, NONE, ControlVector, Vectors, key_of, vectors_of
from .tap import Observer, Tap, tapped


def eog_ids(llama: llama_cpp.Llama) -> tuple[int, ...]:
    """Every end-of-generation id of the vocabulary (llama.cpp's EOG set, not only EOS)."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    is_eog = llama_cpp.llama_vocab_is_eog
    return tuple(i for i in range(int(llama.n_vocab())) if is_eog(vocab, i))


class Context:
    """A loaded `Llama` and the bookkeeping for reusing its KV cache."""

    def __init__(self, llama: llama_cpp.Llama, cache: PromptCache | None = None) -> None:
        self.llama = llama
        self.lock = threading.Lock()
        self.vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._owner: object | None = None
        self._closed = False
        self._cache = cache
        self._n_layer = int(llama_cpp.llama_model_n_layer(llama.model))
        self._tap = Tap(int(llama.n_embd()), self._n_layer)  # on the context once one reads
        self._tapped = False
        self._n_batch = int(llama.n_batch)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._one = llama_cpp.llama_batch_init(1, 0, 1)  # the decode step's batch
        fill(self._one, [0], 0, 0, 0)  # a step rewrites only its token and position
        self._one_token, self._one_pos = self._one.token, self._one.pos  # ctypes pointers
        self._key: Hashable = ()  # the steering state the held KV was computed under
        self._bind()

    def _bind(self) -> None:
        """What holds the llama.cpp context's pointer, made for the context it is now."""
        llama, cache = self.llama, self._cache
        self._ctx = llama.ctx
        self._logits = Logits(self._ctx, int(llama.n_vocab()))
        self._states = None if cache is None or not cache.enabled else States(self._ctx, cache, 1)
        self._cvec = ControlVector(self._ctx, int(llama.n_embd()), self._n_layer)

    def _read_by(self, observer: Observer | None) -> None:
        """The tap reads `observer`'s layers at the next decodes (none for None). The first
        time a generation reads, the context is made anew with the tap as its evaluation
        callback (tap.py): until then none runs at all. What the KV held is dropped then."""
        if observer is None:
            if self._tapped:  # an untapped context reads nothing already
                self._tap.want(())
            return
        if not self._tapped:
            tapped(self.llama, self._tap)
            self._tapped = True
            self.llama.n_tokens = 0
            self._owner, self._key = None, ()
            self._bind()
        self._tap.want(observer.layers)

    @property
    def tapped(self) -> bool:
        """Whether the context carries the tap yet (a generation has read a layer)."""
        return self._tapped

    @property
    def window(self) -> int:
        """How many tokens the context holds at most (n_ctx)."""
        return int(self.llama.n_ctx())

    @property
    def held(self) -> list[int]:
        """The ids the KV cache holds now."""
        return [int(i) for i in self.llama.input_ids[: self.llama.n_tokens]]

    def is_eog(self, token_id: int) -> bool:
        """Whether `token_id` ends generation (any of the vocabulary's EOG tokens)."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token_id))

    def hold(
        self,
        ids: Sequence[int],
        owner: object,
        reuse: bool = True,
        steering: SteeringSource | None = None,
        observer: Observer | None = None,
    ) -> int:
        """Make the KV cache hold exactly `ids`, what runs now steered by `steering`
        (steering.py) and read by `observer` (tap.py); returns how many were reused (with
        `reuse` false, none but the owner's own sequence, one step ago). KV computed under
        another steering state is never reused."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        vectors = self._run_under(steering, observer)
        llama = self.llama
        n = llama.n_tokens
        key = key_of(steering)
        if self._owner is owner and n == len(ids) - 1:  # the owner's next token: the common case
            if key != self._key:  # the state moved mid-generation: its KV mixes two
                self._key = MIXED
            token = ids[-1]
            self._one_token[0], self._one_pos[0] = token, n
            status = llama_cpp.llama_decode(self._ctx, self._one)
            if status != 0:
                self._failed(n, status)
            llama.input_ids[n] = token
            llama.n_tokens = n + 1
            self._observed(observer, vectors)
            return n
        reused = self._take_prefix(ids if reuse else (), key)
        self._owner = owner
        self._prefill(ids, reused, observer, vectors)
        return reused

    def _run_under(self, steering: SteeringSource | None, observer: Observer | None) -> Vectors:
        """The next decodes read by `observer` and steered by `steering`'s vectors, read now
        (returned: what the observer's pre-steering rows take off)."""
        self._read_by(observer)
        vectors = vectors_of(steering)
        self._cvec.set(vectors)
        return vectors

    def _observed(self, observer: Observer | None, vectors: Vectors) -> None:
        """Hand the last decode's rows of the layers read to `observer`."""
        if observer is not None:
            observer.feed(self._tap.take(), vectors)

    def _take_prefix(self, ids: Sequence[int], key: Hashable = ()) -> int:
        """Keep what the cache shares with `ids` (nothing for no ids, nor when it was computed
        under another steering state than `key`), or restore a longer prefix computed under
        `key` from the prompt cache (states.py); what the KV drops is saved there first,
        under its own state. The count kept; the KV is `key`'s from here on."""
        states, llama, held_key = self._states, self.llama, self._key
        own = ids if key == held_key else ()
        self._key = key
        if states is None:
            return self._keep_prefix(own)
        held = [int(i) for i in llama.input_ids[: llama.n_tokens]]
        kept = self._common(own)
        restored = states.restore(0, ids, kept, held, key, held_key) if ids else None
        if restored is None:
            if kept < len(held):
                states.save(0, held, held_key)
            return self._keep_prefix(own)
        llama.input_ids[: len(restored)] = restored
        llama.n_tokens = len(restored)
        return len(restored)

    def _prefill(
        self, ids: Sequence[int], start: int, observer: Observer | None, vectors: Vectors
    ) -> None:
        """Run `ids[start:]` after the `start` tokens the cache holds, in chunks of n_batch;
        logits for the last one only (every one's where the tap must see every row).
        Whatever the cache holds past `start` goes first."""
        llama, batch = self.llama, self._batch
        llama._ctx.kv_cache_seq_rm(-1, start, -1)
        every = self._tap.every_row
        for first in range(start, len(ids), self._n_batch):
            chunk = ids[first : first + self._n_batch]
            fill(batch, chunk, first, 0, len(ids) - 1, every=every)
            status = llama_cpp.llama_decode(self._ctx, batch)
            if status != 0:
                self._failed(first, status)
            llama.input_ids[first : first + len(chunk)] = chunk
            llama.n_tokens = first + len(chunk)
            self._observed(observer, vectors)

    def _failed(self, held: int, status: int) -> NoReturn:
        """A decode failed: the cache keeps the `held` tokens that ran before it."""
        self.llama._ctx.kv_cache_seq_rm(-1, held, -1)
        self.llama.n_tokens = held
        raise RuntimeError(f"llama_decode failed ({status})")

    def reuse_prefix(self, ids: Sequence[int]) -> int:
        """Keep what the cache shares with `ids` (at most all but the last); the count."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        return self._keep_prefix(ids)

    def unsteer(self) -> None:
        """What runs next is unsteered and unread (a decision, an embedding, under the lock):
        the control vector cleared, the tap reading nothing, and KV computed under steering
        dropped."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        self._cvec.set(NONE)
        self._read_by(None)
        if self._key != ():
            self._take_prefix((), ())

    def forget_owner(self) -> None:
        """Someone else (a decision) changed the cache: the next generation step re-holds."""
        self._owner = None

    def _common(self, ids: Sequence[int]) -> int:
        """How many of `ids` the cache holds (at most all but the last)."""
        llama = self.llama
        limit = min(llama.n_tokens, len(ids) - 1)
        if limit <= 0:
            return 0
        held = llama.input_ids[:limit]
        differ = np.flatnonzero(held != np.asarray(ids[:limit], dtype=held.dtype))
        return int(differ[0]) if differ.size else limit

    def _keep_prefix(self, ids: Sequence[int]) -> int:
        """Drop what the cache holds past its common prefix with `ids` (< len(ids))."""
        llama = self.llama
        kept = self._common(ids)
        if kept < llama.n_tokens and (kept == 0 or not llama._ctx.kv_cache_seq_rm(-1, kept, -1)):
            # nothing to keep, or a cache that cannot drop a tail (recurrent models)
            llama.reset()  # type: ignore[no-untyped-call]
            kept = 0
        llama.n_tokens = kept
        return kept

    def pick(self, picking: Picking) -> Token:
        """The next token after what the cache holds (call right after `hold`)."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        return picking.pick(self._logits, -1, self.vocab)

    def hold_scored(
        self,
        ids: Sequence[int],
        owner: object,
        k: int,
        steering: SteeringSource | None = None,
        observer: Observer | None = None,
    ) -> list[Logprobs]:
        """Make the KV cache hold exactly `ids`, all of them run now (steered by `steering`)
        with every position's logits kept: each id after the first gets its log-probability
        and its `k` best (engines/logprobs.py), read chunk by chunk as each batch is
        decoded."""
        if self._closed:
            raise RuntimeError("the llama.cpp context is closed")
        vectors = self._run_under(steering, observer)
        llama, batch = self.llama, self._batch
        self._take_prefix((), key_of(steering))
        self._owner = owner
        llama._ctx.kv_cache_seq_rm(-1, 0, -1)
        out: list[Logprobs] = []
        for first in range(0, len(ids), self._n_batch):
            chunk = ids[first : first + self._n_batch]
            fill(batch, chunk, first, 0, len(ids) - 1, every=True)
            status = llama_cpp.llama_decode(self._ctx, batch)
            if status != 0:
                self._failed(first, status)
            llama.input_ids[first : first + len(chunk)] = chunk
            llama.n_tokens = first + len(chunk)
            self._observed(observer, vectors)
            rows = self._logits.rows(len(chunk))
            following = ids[first + 1 : first + len(chunk) + 1]
            out.extend(of_rows(torch.from_numpy(rows[: len(following)]), following, k))
        return out

    def score(
        self, ids: Sequence[int], query: ScoreQuery, observer: Observer | None = None
    ) -> Scored:
        """Next-token scoring (OAI-SCORE): `ids` held unsteered, the last position's logits
        scored (engines/logprobs.py). An unsteered prefix the context holds or the prompt
        cache stores is reused (issue 43) unless `observer` reads every position; with
        `query.prompt_logprobs` (echo), the whole of `ids` runs, every position's logits
        read."""
        with self.lock:
            owner = object()
            cached = 0
            if query.prompt_logprobs is None:
                reuse = query.reuse and observer is None
                cached = self.hold(ids, owner, reuse=reuse, observer=observer)
                prompt: tuple[Logprobs, ...] = ()
            else:
                k = query.prompt_logprobs
                prompt = tuple(self.hold_scored(ids, owner, k, observer=observer))
            result = scored(torch.from_numpy(self._logits.row(-1)), query)
        return replace(result, prompt=prompt, cached_tokens=cached)

    def close(self) -> None:
        """Free the model and the context; a generator still open fails at its next step."""
        with self.lock:
            self._closed = True
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_batch_free(self._one)
            self.llama.close()
