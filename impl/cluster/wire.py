"""What crosses between a cluster's deployments: a validated request, sent on whole.

The ingress has run the request through the contract (security, the strict body
reader, Connexion's validation) before it becomes a `Forwarded`: what the
router places (router.py), what the ingress sends to the chosen replica's port
as HTTP (hop.py), and what the control sends a replica through its handle,
which runs it through its own server in process (http/inprocess.py) and
streams back the ASGI messages it sends. Either way a reply is byte for byte
what a single `miserver serve` sends, with two headers added: `X-miLLM-Replica` (which
replica served it) and `X-miLLM-Epoch` (the cluster's epoch it was served at).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .affinity import NONE, Affinity

REPLICA = b"x-millm-replica"
EPOCH = b"x-millm-epoch"
# what the next hop sets itself, or must not see: hop-by-hop fields, the browser's origin
# and fetch metadata (the ingress checked them against its own Host and origins: a replica,
# reached from loopback, would judge them against its own), the cookies, the length (the
# body is sent whole). The
# credentials go on: the next hop holds no key (options.py), but the security model reads
# their presence (a multipart upload needs an Authorization header)
DROPPED = frozenset(
    {
        b"host",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"content-length",
        b"origin",
        b"referer",
        b"sec-fetch-site",
        b"sec-fetch-mode",
        b"sec-fetch-dest",
        b"sec-fetch-user",
        b"cookie",
    }
)


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One validated request. `epoch` is the cluster's epoch when the ingress admitted it:
    only a replica at that epoch or later serves it. `replica`, when set, is the one
    replica that may take it; `avoid`, those the router passes over while others live."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    epoch: int
    operation: str = ""  # the spec's operationId
    affinity: Affinity = NONE
    replica: str | None = None
    background: bool = False  # a Batch API line's: behind interactive requests, preemptible
    avoid: frozenset[str] = frozenset()  # replicas lost on an earlier try of this request


def kept_headers(headers: Sequence[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """The request's headers a replica sees."""
    return tuple((k, v) for k, v in headers if k.lower() not in DROPPED)


def header(headers: Sequence[tuple[bytes, bytes]] | Mapping[bytes, bytes], name: bytes) -> str:
    """One response header's value ("" when absent)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return next((v.decode("latin-1") for k, v in pairs if k.lower() == name), "")
