"""A front end's names for the chat fields its requests run as (Responses, Messages).

A front end on the chat path (serving/responses, serving/messages) keeps a table of the
chat field each of its fields becomes; a refusal or a report of the chat path names the
chat field, and is given back under the front end's name: the first entry whose chat
field is the location or a path under it (`response_format.json_schema.schema` under
`response_format`) wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ApiError

Renames = Sequence[tuple[str, str]]  # (chat field, the front end's field), first match wins


def matched(location: str, table: Renames) -> tuple[str, str] | None:
    """The table's first entry for `location`, or None."""
    for chat, ours in table:
        if location == chat or location.startswith((chat + ".", chat + "[")):
            return chat, ours
    return None


def renamed(location: str, table: Renames) -> str:
    """`location` under the front end's name (as it is when the table has none)."""
    found = matched(location, table)
    return location if found is None else found[1] + location[len(found[0]) :]


def renamed_error(exc: ApiError, table: Renames) -> ApiError:
    """`exc` naming the front end's field, in its `param` and its message."""
    found = None if exc.param is None else matched(exc.param, table)
    if exc.param is not None and found is not None:
        exc.message = exc.message.replace(found[0], found[1])
        exc.param = renamed(exc.param, table)
    return exc
