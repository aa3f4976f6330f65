"""Overload: many looping clients against a server for a bounded time, on loopback.

`overload(base_url, pid, body)` runs OVERLOAD_CLIENTS clients for
OVERLOAD_SECONDS, client i sending `body(i)` to /chat/completions again and
again (after a 503 it waits its Retry-After), then waits for the replies in
flight. It counts 200s and their completion tokens, 503s (and those without
Retry-After) and anything else, and samples the server's RSS before and after.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

OVERLOAD_CLIENTS = 64
OVERLOAD_SECONDS = 60.0
OVERLOAD_TOKENS = 64
OVERLOAD_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Tally:
    """What one overload client saw."""

    ok: int = 0
    tokens: int = 0
    refused: int = 0
    without_retry_after: int = 0
    other: Counter[str] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        self.ok += other.ok
        self.tokens += other.tokens
        self.refused += other.refused
        self.without_retry_after += other.without_retry_after
        self.other.update(other.other)


def _one(client: httpx.Client, base_url: str, body: dict[str, Any], tally: Tally) -> float:
    """One chat, counted in `tally`; the seconds to wait before the next."""
    try:
        response = client.post(f"{base_url}/chat/completions", json=body)
    except httpx.HTTPError as error:
        tally.other[type(error).__name__] += 1
        return 0.0
    if response.status_code == 200:
        tally.ok += 1
        tally.tokens += response.json()["usage"]["completion_tokens"]
        return 0.0
    if response.status_code != 503:
        tally.other[str(response.status_code)] += 1
        return 0.0
    tally.refused += 1
    retry_after = response.headers.get("Retry-After")
    if retry_after is None:
        tally.without_retry_after += 1
        return 1.0
    return float(retry_after)


def overload_client(
    client: httpx.Client, base_url: str, body: dict[str, Any], deadline: float
) -> Tally:
    tally = Tally()
    while time.perf_counter() < deadline:
        wait = _one(client, base_url, body, tally)
        time.sleep(max(0.0, min(wait, deadline - time.perf_counter())))
    return tally


def rss(pid: int) -> int:
    """Resident bytes of the process and its children."""
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])


@dataclass(frozen=True, slots=True)
class Overload:
    tally: Tally
    seconds: float
    rss_start: int
    rss_end: int

    @property
    def rate(self) -> float:
        return self.tally.tokens / self.seconds

    @property
    def drift(self) -> float:
        return self.rss_end / self.rss_start - 1


def overload(base_url: str, pid: int, body: Callable[[int], dict[str, Any]]) -> Overload:
    """OVERLOAD_CLIENTS looping clients for OVERLOAD_SECONDS; in-flight replies waited for."""
    limits = httpx.Limits(max_connections=OVERLOAD_CLIENTS)
    total = Tally()
    rss_start = rss(pid)
    with (
        httpx.Client(timeout=OVERLOAD_TIMEOUT_S, limits=limits) as client,
        ThreadPoolExecutor(max_workers=OVERLOAD_CLIENTS) as pool,
    ):
        started = time.perf_counter()
        deadline = started + OVERLOAD_SECONDS
        futures = [
            pool.submit(overload_client, client, base_url, body(i), deadline)
            for i in range(OVERLOAD_CLIENTS)
        ]
        for future in futures:
            total.add(future.result(timeout=OVERLOAD_SECONDS + 2 * OVERLOAD_TIMEOUT_S))
        seconds = time.perf_counter() - started
    return Overload(total, seconds, rss_start, rss(pid))
