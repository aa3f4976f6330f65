"""`miserver-conformance --base-url URL [--model ID] [--api-key KEY]`: check a server over HTTP.

Exit status: 0 when every check passed or was not offered, 1 when any check
failed (or errored), 2 when the kit could not run at all.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

from .checks import all_checks
from .context import DEFAULT_MAX_EXAMPLES, DEFAULT_TIMEOUT_S, KitError
from .report import requirement_key, write_json, write_text
from .runner import EXIT_OK, EXIT_UNUSABLE, run

log = logging.getLogger("miserver.conformance")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="miserver-conformance",
        description="Check an OpenAI-compatible server against the miLLM /v1 contract (REQ-000).",
    )
    p.add_argument("--base-url", help="the OpenAI base URL, with /v1 (http://127.0.0.1:8000/v1)")
    p.add_argument("--model", help="the model id to ask for (default: the loaded one)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this check (repeatable; see --list)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME",
        help="do not run this check (repeatable)",
    )
    p.add_argument(
        "--max-examples",
        type=int,
        default=DEFAULT_MAX_EXAMPLES,
        help=f"Schemathesis examples per operation and mode (default {DEFAULT_MAX_EXAMPLES})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds per HTTP request (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    p.add_argument("--json", action="store_true", help="write the report as JSON")
    p.add_argument("--list", action="store_true", help="list the checks and their IDs, then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


@contextlib.contextmanager
def _progress_on_stderr(*, quiet: bool) -> Iterator[None]:
    """The kit's own progress lines on stderr (not httpx's request log), for this run only."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _list() -> int:
    for check in all_checks():
        ids = ", ".join(sorted(check.requirements, key=requirement_key))
        sys.stdout.write(f"{check.name}\n    {check.summary}\n    {ids}\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with _progress_on_stderr(quiet=args.quiet):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    if not args.base_url:
        log.error("--base-url is required (the OpenAI base URL, with /v1)")
        return EXIT_UNUSABLE
    try:
        report = run(
            args.base_url,
            model=args.model,
            api_key=args.api_key,
            checks=args.check,
            skip=args.skip,
            max_examples=args.max_examples,
            timeout=args.timeout,
        )
    except (KitError, KeyError) as exc:
        log.error("%s", exc.args[0] if exc.args else exc)
        return EXIT_UNUSABLE
    (write_json if args.json else write_text)(report, sys.stdout)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
