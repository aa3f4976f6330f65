"""X-miLLM-Probe-Verdicts: what each armed probe found, as an RFC 8941 List (OAI-PROBE-02..04).

One String item per result, the probe's name, with parameters in this order:

    window   Token    last_user | prompt | completion
    verdict  Token    flagged | clear | none
    score    String   Python repr(float) of the score; absent when nothing was scored
    reason   Token    the result's reason code
    index    Integer  the choice; only when the response has more than one choice

Items are sorted by name, window, then choice (`order`). Built and parsed with
http-sfv; spec/vectors/probe-verdicts-header.json pins the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from http_sfv.item import Item
from http_sfv.list import List
from http_sfv.types import Token


def order(result: Mapping[str, Any]) -> tuple[str, str, int]:
    return (str(result["probe"]), str(result["window"]), int(result["index"]))


def serialize(results: Sequence[Mapping[str, Any]], *, choices: int = 1) -> str:
    """The header value of a response's results (`choices`: how many the response has)."""
    out = List()
    for result in sorted(results, key=order):
        item = Item(str(result["probe"]))
        item.params["window"] = Token(str(result["window"]))
        item.params["verdict"] = Token(str(result["verdict"]))
        if result.get("score") is not None:
            item.params["score"] = repr(float(result["score"]))
        item.params["reason"] = Token(str(result["reason"]))
        if choices > 1:
            item.params["index"] = int(result["index"])
        out.append(item)
    return str(out)


def parse(value: str) -> list[dict[str, Any]]:
    """The header's entries as dicts (name, window, verdict, score, reason, index)."""
    parsed = List()
    parsed.parse(value.encode("ascii"))
    entries = []
    for item in parsed:
        if not isinstance(item, Item) or not isinstance(item.value, str):
            raise ValueError(f"an entry is not a String item: {item!r}")
        params = dict(item.params)
        score = params.get("score")
        entries.append(
            {
                "name": item.value,
                "window": str(params["window"]),
                "verdict": str(params["verdict"]),
                "score": None if score is None else float(str(score)),
                "reason": str(params["reason"]),
                "index": int(params.get("index", 0)),
            }
        )
    return entries
