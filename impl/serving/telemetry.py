"""Per-token and per-generation telemetry for the `token` and `done` events (LOC-EVENTS).

A `Meter` lives in the worker thread of one choice. With nobody listening it
is `quiet`: no `token` events and none of their readings, only the clock,
and the `done` summary still goes to the bus's taps (the planner's
`measured`, planner/service.py). `compute` is the time
spent inside the engine's step (the forward pass and sampling), `wall` the
time between two tokens (detokenizing, stop matching and handing the token
over included), `cpu` the process's CPU time. Keys of the C++ engine's
expert streaming (flash reads, expert cache, MTP) are kept with the values
REQ-003 suggests for an engine that has none: 0, or -1 for "unmeasured".
"""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from .. import request_context
from ..metrics import Watch

_MIB = 1024 * 1024
TOKEN_ZEROS = {"io_ms": 0, "mgmt_ms": 0, "stall_ms": 0, "flash_wait_ms": 0, "read_mib": 0}
TOKEN_UNMEASURED = {
    "cache_hit_pct": -1,
    "cache_budget_mib": 0,
    "dense_resident_frac": -1,
    "mtp_batch": 0,
}
DONE_ZEROS = {
    key: 0
    for key in (
        "prefill_read_mib",
        "prefill_dev_tokens",
        "read_mib",
        "io_s_tok",
        "stall_s_tok",
        "flash_wait_s_tok",
        "mgmt_s_tok",
        "cache_resident_mib",
        "cache_budget_mib",
        "cache_evictions",
        "cache_rereads",
        "token_demand_mib",
        "mtp_drafted",
        "mtp_accepted",
        "mtp_decodes",
        "drafted_steps",
        "mtp_draft_s_tok",
    )
} | {"cache_hit_pct": -1}


def _majflt() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_majflt)


@functools.cache
def _this_process() -> psutil.Process:
    """This process, made once (a `psutil.Process` reads /proc as it is made)."""
    return psutil.Process()


@dataclass(slots=True, kw_only=True)
class Meter:
    """Measures one generation and reports through `emit(name, data)`.

    Made where the request runs (the id of /api/events is the response's `x-request-id`),
    used in the engine's thread.
    """

    emit: Callable[[str, dict[str, Any]], None]
    steps: int
    n_prompt: int
    load_s: float = 0.0
    quiet: bool = False  # nobody listens: no `token` events (and none of their readings)
    watch: Watch | None = None  # the request's metrics (GET /metrics)
    request_id: str | None = field(default_factory=request_context.current)
    _start: float = field(default_factory=time.perf_counter)
    _last: float = 0.0
    _cpu_start: float = field(default_factory=time.process_time)
    _cpu_last: float = 0.0
    _flt_start: int = field(default_factory=_majflt)
    _flt_last: int = 0
    _compute: float = 0.0
    _first: float | None = None
    _tokens: int = 0

    def __post_init__(self) -> None:
        self._last, self._cpu_last, self._flt_last = self._start, self._cpu_start, self._flt_start

    def token(self, compute_s: float) -> None:
        """One generated token, `compute_s` of it spent in the engine's step."""
        now = time.perf_counter()
        if self.watch is not None:
            self.watch.token(now, None if self._first is None else self._last)
        if self._first is None:
            self._first = now
        else:
            self._compute += compute_s  # the first step is the prefill's
        self._tokens += 1
        if self.quiet:
            self._last = now
            return
        cpu, flt = time.process_time(), _majflt()
        self.emit(
            "token",
            {
                "request_id": self.request_id,
                "step": self._tokens,
                "steps": self.steps,
                "wall_ms": (now - self._last) * 1000,
                "compute_ms": compute_s * 1000,
                "cpu_ms": (cpu - self._cpu_last) * 1000,
                "rss_mib": _this_process().memory_info().rss / _MIB,
                "mem_available_mib": psutil.virtual_memory().available / _MIB,
                "majflt": flt - self._flt_last,
                **TOKEN_ZEROS,
                **TOKEN_UNMEASURED,
            },
        )
        self._last, self._cpu_last, self._flt_last = now, cpu, flt

    def done(self, cancelled: bool) -> dict[str, Any]:
        """The generation's summary: the `done` event, sent and returned (a reply's
        `millm_summary`, LOC-CHAT-64/71)."""
        now = time.perf_counter()
        first = self._first if self._first is not None else now
        prefill = first - self._start
        decoded = max(self._tokens - 1, 0)
        decode_s = now - first
        per = (lambda total: total / decoded) if decoded else (lambda _total: 0.0)
        summary = {
            "request_id": self.request_id,
            "cancelled": cancelled,
            "tokens": self._tokens,
            "tok_s": decoded / decode_s if decoded and decode_s > 0 else 0.0,
            "load_s": self.load_s,
            "prefill_s": prefill,
            "prefill_tps": self.n_prompt / prefill if prefill > 0 else 0.0,
            "n_prompt": self.n_prompt,
            "n_past": self.n_prompt + self._tokens,
            "compute_s_tok": per(self._compute),
            "cpu_s_tok": per(time.process_time() - self._cpu_start),
            "majflt_tok": per(_majflt() - self._flt_start),
            "loop_overhead_s_tok": per(max(decode_s - self._compute, 0.0)),
            "ttft_s": prefill,
            **DONE_ZEROS,
        }
        self.emit("done", summary)
        return summary
