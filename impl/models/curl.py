"""The system `curl`, as downloads and the /api/hf routes run it (REQ-003 DL-09, HFM-15)."""

from __future__ import annotations

from urllib.parse import urlsplit

LINE_FAILED = frozenset({6, 7, 16, 18, 28, 35, 52, 55, 56, 92})
"""curl's exit codes for a line that failed (resolve, connect, a cut transfer, a timeout):
a download retries them (LOC-DL-09), and so does the header read of /api/hf/inspect."""


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
