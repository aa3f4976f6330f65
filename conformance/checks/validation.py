"""`X-miLLM-Ignored-Fields` and `X-miLLM-Strict` (REQ-000 VALID, ERR-11).

The contract says `user` is never read (OAI-VALID-13), so a request carrying
it must name `"user"` in `X-miLLM-Ignored-Fields`. A server that never sends
the header for it does not offer the extension: both checks are then "not
offered".
"""

from __future__ import annotations

import httpx

from ..context import Context
from ..failures import HeaderViolation, NotOffered, StrictModeViolation
from ..headers import parse_string_list
from ..registry import check
from ..responses import api_error, expect_status, shown

IGNORED = "X-miLLM-Ignored-Fields"
STRICT = "X-miLLM-Strict"
UNUSED_FIELD = "user"


def _ignored(response: httpx.Response, requirement: str) -> list[str] | None:
    """The header's locations, None when absent; a HeaderViolation when it is not a String List."""
    value = response.headers.get(IGNORED)
    if value is None:
        return None
    try:
        return parse_string_list(value)
    except ValueError as exc:
        raise HeaderViolation(
            f"{IGNORED} as an RFC 8941 List of Strings", f"{value!r} ({exc})", requirement
        ) from None


def _reported_user(ctx: Context, headers: dict[str, str] | None = None) -> httpx.Response:
    response = ctx.post("/chat/completions", ctx.chat_body(user="conformance-kit"), headers)
    expect_status(response, 200, "OAI-VALID-13")
    return response


def _offered(ctx: Context) -> httpx.Response:
    response = _reported_user(ctx)
    if response.headers.get(IGNORED) is None:
        raise NotOffered(f"a request with `user` got no {IGNORED} header")
    return response


@check("OAI-VALID-02", "OAI-VALID-03", "OAI-VALID-04", "OAI-VALID-05", "OAI-VALID-13")
def ignored_fields_reported(ctx: Context) -> None:
    """An unused `user` is named in X-miLLM-Ignored-Fields (streams too); no header when none is."""
    locations = _ignored(_offered(ctx), "OAI-VALID-03")
    if locations is None or UNUSED_FIELD not in locations:
        raise HeaderViolation(f'{IGNORED} naming "user"', repr(locations), "OAI-VALID-13")
    plain = ctx.post("/chat/completions", ctx.chat_body())
    expect_status(plain, 200, "OAI-VALID-04")
    if plain.headers.get(IGNORED) is not None:
        raise HeaderViolation(
            f"no {IGNORED} when nothing was ignored", repr(plain.headers[IGNORED]), "OAI-VALID-04"
        )
    streamed = ctx.post("/chat/completions", ctx.chat_body(user="conformance-kit", stream=True))
    expect_status(streamed, 200, "OAI-VALID-05")
    locations = _ignored(streamed, "OAI-VALID-05")
    if locations is None or UNUSED_FIELD not in locations:
        raise HeaderViolation(
            f'{IGNORED} naming "user" on the stream too', repr(locations), "OAI-VALID-05"
        )


@check("OAI-VALID-10", "OAI-VALID-11", "OAI-VALID-12", "OAI-ERR-11")
def strict_mode_refuses_ignored_fields(ctx: Context) -> None:
    """X-miLLM-Strict true/1 refuses an unused field (400 unused_fields_refused); false/0 report
    it; any other value is a 400 naming the header."""
    _offered(ctx)
    body = ctx.chat_body(user="conformance-kit")
    for value in ("true", "1"):
        response = ctx.post("/chat/completions", body, {STRICT: value})
        if response.status_code != 400:
            raise StrictModeViolation(
                f"{STRICT}: {value} to refuse `user` with 400", shown(response), "OAI-VALID-10"
            )
        error = api_error(response)
        if error.code != "unused_fields_refused" or not error.names(UNUSED_FIELD):
            raise StrictModeViolation(
                "code unused_fields_refused naming `user`", shown(response), "OAI-ERR-11"
            )
    for value in ("false", "0"):
        locations = _ignored(_reported_user(ctx, {STRICT: value}), "OAI-VALID-11")
        if locations is None or UNUSED_FIELD not in locations:
            raise StrictModeViolation(
                f"{STRICT}: {value} to keep reporting `user`", repr(locations), "OAI-VALID-11"
            )
    response = ctx.post("/chat/completions", body, {STRICT: "yes"})
    if response.status_code != 400 or not api_error(response).names(STRICT):
        raise StrictModeViolation(
            f"{STRICT}: yes refused with 400 naming the header", shown(response), "OAI-VALID-12"
        )
