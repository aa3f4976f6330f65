"""The first step of every /v1 model route: which model, what it can do, and which fields
of the body it will not use.

`admit` is the raw body's one reader outside the request builder: the field
matrix (serving/policy.py, spec/policy/fields.yaml) must see undeclared keys
and no-change values, which a typed request no longer shows. It runs before
any load, in the contract's order: the `X-miLLM-Strict` header, the model
entry, the capability the route needs, then the matrix, which refuses what
the engine cannot honour and lists what it will ignore. The route adds what
only it knows to be unused, and `headers` reports them all (or refuses them,
in strict mode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .. import headers as hdr
from ..engines.base import Capability
from ..errors import InvalidParameter
from ..models.manager import ModelManager
from ..models.registry import ModelEntry
from .policy import honours, report_unused, review

NEEDS = {  # endpoint -> the capability its model must have, and the refusal's words
    "chat": (Capability.GENERATE, "is an embedding model: use /v1/embeddings"),
    "completions": (Capability.GENERATE, "is an embedding model: use /v1/embeddings"),
    "embeddings": (Capability.EMBEDDINGS, "cannot embed"),
    "responses": (Capability.GENERATE, "is an embedding model: use /v1/embeddings"),
    "messages": (Capability.GENERATE, "is an embedding model: use /v1/embeddings"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """A request let in: its model, that model's capabilities, and what the matrix ignores."""

    endpoint: str
    entry: ModelEntry
    capabilities: frozenset[Capability]
    ignored: tuple[str, ...]
    strict: bool
    trace_id: str = ""  # the W3C trace the request joins (probes/trace.py)
    traceparent: tuple[str, ...] = ()  # the `traceparent` values it sent (tracing.py)

    def honours(self, name: str) -> bool:
        """Whether this endpoint uses the field `name` on this model."""
        return honours(self.endpoint, name, self.entry.engine, self.capabilities)

    def reporting(self, unused: Sequence[str]) -> Admission:
        """This admission with more fields to report unused: nested members a front end
        found changing nothing, which the field matrix does not see."""
        return replace(self, ignored=(*self.ignored, *unused))

    def headers(self, unused: Sequence[str], max_bytes: int) -> dict[str, str]:
        """`X-miLLM-Model` and the report of every unused field, the matrix's and `unused`;
        in strict mode an unused field is refused instead (OAI-VALID-10)."""
        report = report_unused([*self.ignored, *unused], self.strict, max_bytes)
        return {hdr.MODEL: self.entry.model_id, **report}


def admit(
    manager: ModelManager,
    endpoint: str,
    model_id: str,
    body: Mapping[str, object],
    *,
    request_headers: Mapping[str, str],
) -> Admission:
    """Let a request in, or refuse it before any load."""
    strict = hdr.strict_mode(request_headers)
    entry = manager.entry(model_id)
    manager.check_lock(entry)  # before any load (OAI-MODELS-05)
    capabilities = manager.capabilities(entry)
    need, refusal = NEEDS[endpoint]
    if need not in capabilities:
        raise InvalidParameter("model", f"`{entry.model_id}` {refusal}.")
    ignored = review(endpoint, body, entry.engine, capabilities)
    return Admission(
        endpoint=endpoint,
        entry=entry,
        capabilities=capabilities,
        ignored=tuple(ignored),
        strict=strict,
    )
