"""Who may reach the server: the start-up rules of the security model (REQ-003 SEC).

`access_policy(settings)` resolves the bind, the API key and the admitted
origins once, before anything listens, or raises `StartRefused` naming the
broken rule (the CLI turns it into exit status 2):

- `--api-key-file` and `--api-key` together, or either with `--no-api-key`;
- an unreadable key file, or a key that is empty (after trailing line breaks
  and blanks are stripped) or not printable ASCII without blanks;
- a non-loopback `--host` with no key and no `--no-api-key`;
- an `--allow-origin` that is not an origin (`http[s]://host[:port]`).

The policy's `warning` is what to log at start: every non-loopback bind gets
one, stronger when no key is set (docs/DECISIONS.md, non-loopback bind). The key never
appears in a repr, a message or a log.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .settings import Settings

_DEFAULT_PORTS = {"http": 80, "https": 443}


class StartRefused(Exception):
    """The settings break a start-up rule of the security model: nothing may listen."""


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """The security settings as the middleware applies them."""

    loopback: bool
    key: bytes | None = field(default=None, repr=False)
    allowed_origins: frozenset[str] = frozenset()
    warning: str | None = None


def is_loopback(host: str) -> bool:
    """Whether a bind address is loopback: `localhost`, 127.0.0.0/8 or ::1 (brackets allowed)."""
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _checked_key(key: bytes, source: str) -> bytes:
    if not key:
        raise StartRefused(f"{source} is empty: give a key, or no key option at all")
    if any(not 0x21 <= byte <= 0x7E for byte in key):
        raise StartRefused(
            f"{source} holds a blank, a line break or a non-ASCII character inside the key: "
            "a bearer key is printable ASCII without blanks"
        )
    return key


def read_key_file(path: Path) -> bytes:
    """The key in `path`, trailing line breaks and blanks ignored (LOC-SEC-12)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StartRefused(f"--api-key-file {path}: {exc.strerror or exc}") from None
    return _checked_key(raw.rstrip(b" \t\r\n"), f"--api-key-file {path}")


def _key(settings: Settings) -> bytes | None:
    if settings.api_key_file is not None and settings.api_key is not None:
        raise StartRefused("--api-key-file and --api-key are both given: keep one")
    if settings.api_key_file is not None:
        return read_key_file(settings.api_key_file)
    if settings.api_key is not None:
        return _checked_key(settings.api_key.encode("utf-8"), "--api-key")
    return None


def normalize_origin(url: str) -> str:
    """`url` as a browser serializes an Origin (lower case, no default port), or StartRefused."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise StartRefused(f"--allow-origin {url!r} is not an origin: {exc}") from None
    if (
        parts.scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.path not in {"", "/"}
        or parts.query
        or parts.fragment
    ):
        raise StartRefused(
            f"--allow-origin {url!r} is not an origin: give scheme, host and port only, "
            "e.g. http://localhost:5173"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown_port = "" if port in {None, _DEFAULT_PORTS[parts.scheme]} else f":{port}"
    return f"{parts.scheme}://{host.lower()}{shown_port}"


def _warning(settings: Settings, key: bytes | None) -> str | None:
    if is_loopback(settings.host):
        return None
    where = f"{settings.host}:{settings.port}"
    if key is None:
        return (
            f"serving an OPEN server on {where} (--no-api-key): anyone who can reach this "
            "port can use every /api and /v1 endpoint, with no key and no TLS"
        )
    return (
        f"serving the network on {where}: the host-name check is off, the API key stands "
        "in its place, and without TLS the key and all traffic cross the network in clear"
    )


def access_policy(settings: Settings) -> AccessPolicy:
    """The policy the settings ask for, or StartRefused when they break a start-up rule."""
    key = _key(settings)
    if settings.no_api_key and key is not None:
        raise StartRefused("--no-api-key contradicts the key option given with it: keep one")
    loopback = is_loopback(settings.host)
    if not loopback and key is None and not settings.no_api_key:
        raise StartRefused(
            f"--host {settings.host} is beyond loopback and no API key is set: "
            "give --api-key-file PATH, or --no-api-key to serve an open server on purpose"
        )
    origins = frozenset(normalize_origin(url) for url in settings.allow_origin)
    return AccessPolicy(loopback, key, origins, _warning(settings, key))
