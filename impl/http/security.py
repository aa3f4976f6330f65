"""The security middleware (REQ-003 SEC): every HTTP request passes here first.

The checks run in this order (docs/DECISIONS.md, security checks); the first broken rule
ends the request with an OpenAI-format error before any handler runs:

    paths      rule                                                refusal
    all        bound to loopback: Host is localhost, 127.0.0.1     403 forbidden_host
               or [::1], any port
    /api /v1   Origin is the server's own (http:// + Host) or an   403 forbidden_origin
               --allow-origin; with no Origin, Sec-Fetch-Site is
               same-origin, none or absent
    /api /v1   with a key: Authorization: Bearer KEY, compared     401 invalid_api_key
               with hmac.compare_digest                            + WWW-Authenticate
    all        a declared Content-Length within BODY_CAP           413 payload_too_large
    /api /v1   OPTIONS (a CORS preflight)                          405 method_not_allowed
    /api /v1   every method but GET and HEAD declares              415 unsupported_media_type
               application/json (any case, charset=utf-8 allowed),
               or, on POST /v1/files alone, multipart/form-data with
               an Authorization header (a cross-site form sends none)
    all        the body read (chunked too) stays within BODY_CAP   413 payload_too_large
    /api /v1   the path and query, percent-decoded, are UTF-8      400 invalid_request
    /v1 /api   a request that would queue, while the queue is      503 queue_full
               full (`gate`: the app says which)                       + Retry-After
    /api /v1   a body (every method but GET and HEAD) is UTF-8     400 invalid_json (/v1),
               JSON, at most JSON_MAX_DEPTH deep, with no name         invalid_request (/api)
               twice in an object (http/body.py)
    /api /v1   ... holding values JSON and the engines can take:   400 invalid_parameter
               no NaN, lone surrogate, number past int64 / float

The body is read whole (at most BODY_CAP bytes) before the app is called,
parsed once, and replayed to it with its Content-Length (a chunked one too);
the parsed document rides in the scope (`body.BODY_KEY`) for the validators
and handlers. Every response, refusals, errors and event streams alike,
carries SECURITY_HEADERS exactly and never an `Access-Control-*` header;
`x-request-id` is set around this middleware (http/request_id.py), so its
refusals carry one too.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..access import AccessPolicy
from ..errors import ApiError
from .body import BODY_KEY, MAX_DEPTH, BodyRefused, read

log = logging.getLogger(__name__)

BODY_CAP = 8 * 1024 * 1024  # 8 MiB (LOC-SEC-67)
FORM_PATHS = frozenset({("POST", "/v1/files")})  # multipart/form-data, with Authorization
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "font-src 'self'; connect-src 'self'; media-src 'none'; object-src 'none'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
SAME_ORIGIN_FETCHES = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values that pass
API_PREFIXES = ("/api", "/v1")
# (prefix, one value at fault) -> the code of a body the strict reader refuses (http/body.py)
UNREADABLE_CODES = {
    ("/v1", False): "invalid_json",
    ("/api", False): "invalid_request",  # LOC-GEN-14
    ("/v1", True): "invalid_parameter",
    ("/api", True): "invalid_parameter",  # docs/DECISIONS.md, statuses
}
BODYLESS_METHODS = frozenset({"GET", "HEAD"})  # the only ones exempt from the JSON rule
JSON_CHARSETS = frozenset({"utf-8", "utf8"})

_HOST = re.compile(r"(\[[0-9a-f:.]*\]|[^:\[\]]*)(?::\d{1,5})?")
_SECURITY_NAMES = frozenset(name.lower().encode("latin-1") for name in SECURITY_HEADERS)
_SECURITY_RAW = [
    (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in SECURITY_HEADERS.items()
]


class _TooLarge(Exception):
    """A body went past BODY_CAP while it was read."""


@dataclass(frozen=True, slots=True)
class _Request:
    """What the checks read: method, path, headers; `api` when under /api or /v1."""

    method: str
    path: str
    headers: Headers

    @property
    def prefix(self) -> str | None:
        """`/api` or `/v1` when the path lies under one, else None."""
        return next(
            (p for p in API_PREFIXES if self.path == p or self.path.startswith(p + "/")), None
        )

    @property
    def api(self) -> bool:
        return self.prefix is not None

    @property
    def has_body(self) -> bool:
        """Whether the body is the API's JSON: /api and /v1, every method but GET and HEAD."""
        return self.api and self.method not in BODYLESS_METHODS

    @property
    def form_upload(self) -> bool:
        """A file upload as OpenAI's SDKs send it (contract 0.30.0): `multipart/form-data` on
        a FORM_PATHS route, from a request carrying an `Authorization` header. A cross-site
        HTML form can post multipart but never set that header, and a script that sets it
        cross-site needs a CORS preflight, which is refused: LOC-SEC-25's hole stays shut."""
        if (self.method, self.path) not in FORM_PATHS or "authorization" not in self.headers:
            return False
        media = self.headers.get("content-type", "").split(";")[0].strip().lower()
        return media == "multipart/form-data"


def host_name(host: str) -> str | None:
    """The name part of a Host header value (lower case, port dropped), None when malformed."""
    match = _HOST.fullmatch(host.lower())
    return match.group(1) if match else None


def is_json(content_type: str | None) -> bool:
    """`application/json` in any letter case, with at most a UTF-8 `charset` parameter."""
    if content_type is None:
        return False
    media, *params = (part.strip() for part in content_type.split(";"))
    if media.lower() != "application/json":
        return False
    for param in filter(None, params):
        name, _, value = param.partition("=")
        if (
            name.strip().lower() != "charset"
            or value.strip().strip('"').lower() not in JSON_CHARSETS
        ):
            return False
    return True


def bearer(authorization: str | None) -> bytes:
    """The token of `Authorization: Bearer TOKEN` as sent, or b"" when there is none."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip().encode("latin-1") if scheme.lower() == "bearer" else b""


def secured(send: Send) -> Send:
    """`send` with the security headers set on the response and every CORS header dropped."""

    async def send_secured(message: Message) -> None:
        if message["type"] == "http.response.start":
            kept = [
                (name, value)
                for name, value in message.get("headers", [])
                if not name.lower().startswith(b"access-control-")
                and name.lower() not in _SECURITY_NAMES
            ]
            message = {**message, "headers": kept + _SECURITY_RAW}
        await send(message)

    return send_secured


async def read_capped(receive: Receive) -> bytes | None:
    """The whole body, at most BODY_CAP bytes (else _TooLarge); None when the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > BODY_CAP:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(
    body: bytes, scope: Scope, receive: Receive, extra: Mapping[str, Any]
) -> tuple[Scope, Receive]:
    """The scope and `receive` the app gets: the body read once, declared by its length.

    A chunked body gets a Content-Length (Connexion reads a body without one
    as no body). After the replay, `receive` is the server's again, so the
    app still hears `http.disconnect`. `extra` joins the scope (the parsed body).
    """
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name.lower() not in {b"content-length", b"transfer-encoding"}
    ]
    headers.append((b"content-length", str(len(body)).encode("latin-1")))
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return {**scope, **extra, "headers": headers}, replay


def _target(request: _Request, scope: Scope) -> ApiError | None:
    """A path or query whose percent-escapes do not decode to UTF-8 is refused rather than
    read with U+FFFD, where `/api/profiles/%FF` and `/api/profiles/%80` would name one
    profile."""
    if not request.api:
        return None
    raw_path = scope.get("raw_path") or request.path.encode("utf-8")
    for part, raw in (("path", raw_path), ("query", scope.get("query_string", b""))):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return ApiError(
                "invalid_request",
                f"The request's {part} is not UTF-8 once its percent-escapes are decoded.",
                part,
            )
    return None


def _too_large() -> ApiError:
    return ApiError(
        "payload_too_large",
        f"The request body is over the {BODY_CAP} byte (8 MiB) cap.",
        headers={"Connection": "close"},
    )


async def _refuse(refusal: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
    response = Response(
        refusal.body_bytes(),
        status_code=refusal.status,
        media_type="application/json",
        headers=refusal.headers,
    )
    await response(scope, receive, send)


class SecurityMiddleware:
    """Host, Origin, key, size and media-type checks; security headers on every response."""

    def __init__(
        self,
        app: ASGIApp,
        policy: AccessPolicy,
        max_depth: int = MAX_DEPTH,
        gate: Callable[[str, str], ApiError | None] | None = None,
    ) -> None:
        self.app = app
        self.policy = policy
        self.max_depth = max_depth
        self.gate = gate  # (method, path) -> a refusal before the body is parsed (busy)
        self.checks: tuple[Callable[[_Request], ApiError | None], ...] = (
            self._host,
            self._origin,
            self._key,
            self._declared_size,
            self._preflight,
            self._media_type,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = secured(send)
        request = _Request(scope["method"], scope["path"], Headers(scope=scope))
        refusal = next(filter(None, (check(request) for check in self.checks)), None)
        body: bytes | None = None
        parsed: dict[str, Any] = {}
        if refusal is None:
            try:
                body = await read_capped(receive)  # read before any 400: no reset mid-send
                refusal = _target(request, scope) or self._gated(request)
                parsed = {} if refusal else self._parsed(request, body)
            except _TooLarge:
                refusal = _too_large()
            except BodyRefused as exc:
                code = UNREADABLE_CODES[request.prefix or "/v1", exc.value]
                refusal = ApiError(code, exc.message, exc.param)
        if refusal is not None:
            log.info("%d %s: %s %s", refusal.status, refusal.code, request.method, request.path)
            await _refuse(refusal, scope, receive, send)
        elif body is not None:  # None: the client left while sending its body
            await self.app(*replaying(body, scope, receive, parsed), send)

    def _gated(self, request: _Request) -> ApiError | None:
        """A refusal the server gives before parsing anything: a full queue refuses a
        request that would wait in it at once, taking no CPU from the running work."""
        return None if self.gate is None else self.gate(request.method, request.path)

    def _parsed(self, request: _Request, body: bytes | None) -> dict[str, Any]:
        """`{BODY_KEY: document}` for an API body (http/body.py); empty when there is none."""
        if not body or not request.has_body or request.form_upload:
            return {}
        return {BODY_KEY: read(body, self.max_depth)}

    def _host(self, request: _Request) -> ApiError | None:
        """LOC-SEC-17: on loopback, only loopback host names (DNS rebinding)."""
        host = request.headers.get("host", "")
        if not self.policy.loopback or host_name(host) in LOOPBACK_HOSTS:
            return None
        return ApiError(
            "forbidden_host",
            f"Host {host!r} is not a loopback name: this server answers only localhost, "
            "127.0.0.1 and [::1].",
            "Host",
        )

    def _origin(self, request: _Request) -> ApiError | None:
        """LOC-SEC-18: a browser request only from the server's own page."""
        if not request.api:
            return None
        origin = request.headers.get("origin")
        if origin is None:
            site = request.headers.get("sec-fetch-site")
            if site is None or site.strip().lower() in SAME_ORIGIN_FETCHES:
                return None
            return ApiError(
                "forbidden_origin",
                f"A browser request from another site (Sec-Fetch-Site: {site}) is refused.",
                "Sec-Fetch-Site",
            )
        own = "http://" + request.headers.get("host", "").lower()
        if origin.lower() == own or origin.lower() in self.policy.allowed_origins:
            return None
        return ApiError(
            "forbidden_origin",
            f"Origin {origin!r} is not this server's own ({own}).",
            "Origin",
        )

    def _key(self, request: _Request) -> ApiError | None:
        """LOC-SEC-05: with a key, `Authorization: Bearer KEY` on /api and /v1."""
        if self.policy.key is None or not request.api:
            return None
        presented = bearer(request.headers.get("authorization"))
        if hmac.compare_digest(presented, self.policy.key):
            return None
        message = (
            "The API key is not correct."
            if presented
            else "This server needs an API key: send Authorization: Bearer KEY."
        )
        return ApiError(
            "invalid_api_key", message, "Authorization", headers={"WWW-Authenticate": "Bearer"}
        )

    def _declared_size(self, request: _Request) -> ApiError | None:
        """LOC-SEC-67: a declared body over the cap is refused unread."""
        length = request.headers.get("content-length", "")
        return _too_large() if length.isdigit() and int(length) > BODY_CAP else None

    def _preflight(self, request: _Request) -> ApiError | None:
        """OPTIONS (a CORS preflight) is 405, never answered with CORS (docs/DECISIONS.md)."""
        if not request.api or request.method != "OPTIONS":
            return None
        return ApiError(
            "method_not_allowed",
            "OPTIONS is not served: this API answers no cross-origin preflight.",
            None,
        )

    def _media_type(self, request: _Request) -> ApiError | None:
        """LOC-SEC-25: JSON on every method but GET and HEAD (a form upload aside)."""
        if not request.has_body or request.form_upload:
            return None
        content_type = request.headers.get("content-type")
        if is_json(content_type):
            return None
        got = f"got {content_type!r}" if content_type is not None else "none was given"
        form = (request.method, request.path) in FORM_PATHS
        also = ", or multipart/form-data sent with an Authorization header" if form else ""
        return ApiError(
            "unsupported_media_type",
            f"{request.method} {request.path} needs Content-Type: application/json{also} ({got}).",
            "Content-Type",
        )
