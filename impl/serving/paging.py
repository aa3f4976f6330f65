"""One page of a list, as OpenAI pages its lists: `limit` items in `order` after the item
`after`, with `first_id`, `last_id` and `has_more`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidParameter


def page(
    items: Sequence[Mapping[str, Any]], *, limit: int, order: str, after: str | None
) -> dict[str, Any]:
    """`items` (oldest first) as one page of OpenAI's list object."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidParameter("after", f"No item of this list has the id `{after}`.")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
