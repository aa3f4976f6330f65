"""X-miLLM-Circuit-Rung: how strong the evidence is for a circuit that steered (OAI-RUNG).

The value is an RFC 8941 Item: a bare Integer, the rung 0-3 the circuit's
evidence ladder reached, with one parameter `language`, a String rendered by
the server from the rung (never composed per request, OAI-RUNG-03):

    0   associated                        mined co-occurrence only, unvalidated
    1   suggested (attribution-supported) attribution evidence, not causal
    2   causally validated (edge)         each edge causally validated
    3   faithfulness-tested (circuit)     the whole circuit faithfulness-tested

Serialised canonically, `2;language="causally validated (edge)"` (REQ-000 open
point 18); `parse` also takes the documented `2; language=...` with a space.
`rung_header` decides whether a response carries it at all (OAI-RUNG-09..17):
only when a circuit genuinely steered, and then the lowest rung among the
circuits that did (open point 17), so the header never over-claims. A missing
header means "no circuit-attributable steering", never rung 0.
spec/vectors/circuit-rung-header.json pins both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from http_sfv.item import Item

LANGUAGE: Mapping[int, str] = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}
CAUSAL_FROM = 2  # a rung below this is never described as causal (OAI-RUNG-04)
MODES = ("circuit", "slice_fallback")


def serialize(rung: int) -> str:
    """The header value for `rung`: `<rung>;language="<phrase>"`."""
    if isinstance(rung, bool) or rung not in LANGUAGE:
        raise ValueError(f"a rung is an integer 0-3, not {rung!r}")
    item = Item(rung)
    item.params["language"] = LANGUAGE[rung]
    return str(item)


def parse(value: str) -> tuple[int, str]:
    """(rung, language) of a header value, canonical or with a space after `;`."""
    item = Item()
    item.parse(value.encode("ascii"))
    rung, language = item.value, item.params.get("language")
    if isinstance(rung, bool) or not isinstance(rung, int) or rung not in LANGUAGE:
        raise ValueError(f"not a rung 0-3: {value!r}")
    if not isinstance(language, str) or language != LANGUAGE[rung]:
        raise ValueError(f"the language of rung {rung} is {LANGUAGE[rung]!r}: {value!r}")
    return rung, language


@dataclass(frozen=True, slots=True, kw_only=True)
class CircuitState:
    """One circuit that is the request's steering base, as the response's header sees it."""

    id: str
    rung: int | None  # None: the definition could not be parsed (OAI-RUNG-11)
    mode: str = "circuit"  # or slice_fallback: steered by its backing cluster (OAI-RUNG-10)
    attached: bool = True  # an SAE is attached on at least one of its member layers
    steered: bool = True  # X-miLLM-Steering carries its `circuit` member (OAI-RUNG-16)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestState:
    """What in the request turns the header off, whatever the circuits."""

    off: bool = False  # steering_intensity "off" or 0 (OAI-RUNG-13)
    inline: bool = False  # inline `steering` replaced the circuit's values (OAI-RUNG-14)
    scoring: bool = False  # a scoring request (OAI-RUNG-15)


def rung_header(circuits: Sequence[CircuitState], request: RequestState) -> str | None:
    """X-miLLM-Circuit-Rung for a response, or None where OAI-RUNG-09..16 omit it."""
    if request.off or request.inline or request.scoring:
        return None
    steering = [c for c in circuits if c.mode == "circuit" and c.attached and c.steered]
    rungs = [c.rung for c in steering]
    if not rungs or None in rungs:  # none steering (OAI-RUNG-09), or one whose evidence
        return None  # cannot be read: its rung might be the lowest (OAI-RUNG-11)
    return serialize(min(r for r in rungs if r is not None))
