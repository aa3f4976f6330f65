"""What the config gives a generation request that leaves a field out (docs/LOCAL.md).

The `/v1` contract (document 000) lets each request set its own sampling,
and a request's own value always wins. The config's request-scoped
parameters (document 003: `temp`, `top-k`, `top-p`, `seed`, `n-predict`,
`think`) are the defaults for what a request leaves out, so a person sets
them once in the UI and every client without an opinion follows:

    request field            config parameter    table default
    temperature              temp                1.0 (OpenAI's)
    top_p                    top-p               1.0 (off)
    top_k (Messages only)    top-k               0 (off)
    seed                     seed                4294967295: none, random per run
    max_tokens, absent/0     n-predict           512, cut to what the window leaves
    think (LOC-CHAT-32)      think               false

`max_tokens` above `n-predict`'s maximum is clamped to it (LOC-SEC-41,
LOC-CHAT-23). A configured seed applies where the engine honours seeds (both
engines do), and is echoed in `X-miLLM-Seed` as a request's seed is. Scoring
requests take none of these: they are greedy and one token by definition.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .requests import GenerationRequest

N_PREDICT_CAP = 32768  # n-predict's maximum where the table sets none


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDefaults:
    max_tokens: int = 512  # n-predict
    max_tokens_cap: int = N_PREDICT_CAP  # n-predict's maximum
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    think: bool = False

    def apply(self, req: GenerationRequest, *, seeds: bool) -> GenerationRequest:
        """`req` with the defaults for the sampling fields it left out (None); `seeds`:
        whether the engine honours a seed. After it, `temperature`, `top_p` and `top_k` are
        set."""
        changes: dict[str, Any] = {}
        if req.top_k is None:
            changes["top_k"] = self.top_k
        if req.temperature is None:
            changes["temperature"] = self.temperature
        if req.top_p is None:
            changes["top_p"] = self.top_p
        if seeds and req.seed is None and self.seed is not None:
            changes["seed"] = self.seed
        return replace(req, **changes)

    def ceiling(self, asked: int | None) -> int | None:
        """A request's `max_tokens` clamped to n-predict's maximum; None when absent or 0."""
        return min(asked, self.max_tokens_cap) if asked else None
