"""The headers every response carries, written out as REQ-003 gives them (LOC-SEC-36..39).

Literals, not impl's own table (`miserver.http.security.SECURITY_HEADERS`), so
a weakened policy fails the tests that compare against these.
"""

from __future__ import annotations

REQUIRED_HEADERS = {
    "Content-Security-Policy": (  # LOC-SEC-36, exactly
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "font-src 'self'; connect-src 'self'; media-src 'none'; object-src 'none'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",  # LOC-SEC-37
    "Referrer-Policy": "no-referrer",  # LOC-SEC-38
    "X-Frame-Options": "DENY",  # LOC-SEC-39
}
