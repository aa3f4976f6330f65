"""The conformance kit: check any OpenAI-compatible server against the miLLM `/v1` contract.

It speaks only HTTP (httpx; Schemathesis for the OpenAPI run) and imports
nothing of the server. From Python:

    from miserver.conformance import run
    report = run("http://127.0.0.1:8000/v1")
    report.exit_code  # 0: every check passed or was not offered

From a shell: `miserver-conformance --base-url http://127.0.0.1:8000/v1`
(docs/CONFORMANCE.md).
"""

from .checks import all_checks
from .context import Context, KitError
from .failures import Failure, NotOffered
from .registry import Check, check
from .runner import Outcome, Report, Result, run

__all__ = [
    "Check",
    "Context",
    "Failure",
    "KitError",
    "NotOffered",
    "Outcome",
    "Report",
    "Result",
    "all_checks",
    "check",
    "run",
]
