"""The system `curl`, as downloads and the /api/hf routes run it (REQ-003 DL-09, HFM-15)."""

from __future__ import annotations

from urllib.parse import urlsplit


def argv(curl: str, endpoint: str) -> list[str]:
    """curl's command line up to its own options: quiet but for errors, redirects followed
    (at most ten) only within the endpoint's own scheme, never to another (LOC-SEC-50)."""
    scheme = urlsplit(endpoint).scheme or "https"
    return [
        curl,
        "--silent",
        "--show-error",
        "--location",
        "--max-redirs",
        "10",
        "--proto",
        f"={scheme}",
        "--proto-redir",
        f"={scheme}",
    ]
