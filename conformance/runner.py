"""Running checks: each one's outcome, and the run's exit code.

passed       the check returned
failed       it raised a Failure: the server broke the contract
not offered  it raised NotOffered: the server lacks the extension
error        anything else (a transport error, a kit bug): nothing was decided
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .checks import select
from .context import DEFAULT_MAX_EXAMPLES, DEFAULT_TIMEOUT_S, Context
from .failures import Failure, NotOffered
from .registry import Check

log = logging.getLogger("miserver.conformance")

EXIT_OK = 0  # every check passed or was not offered
EXIT_FAILED = 1  # at least one check failed or errored
EXIT_UNUSABLE = 2  # the kit could not run: bad arguments, server unreachable, no model


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_OFFERED = "not offered"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Result:
    """One check's outcome; `detail` says why it failed, errored or was not offered."""

    check: Check
    outcome: Outcome
    detail: str = ""
    failure: Failure | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Report:
    """A whole run: the server, the model asked for, every result in check order."""

    base_url: str
    model: str
    results: list[Result]

    @property
    def exit_code(self) -> int:
        bad = (Outcome.FAILED, Outcome.ERROR)
        return EXIT_FAILED if any(r.outcome in bad for r in self.results) else EXIT_OK

    def outcome_of(self, name: str) -> Outcome:
        """The outcome of the check called `name` (KeyError when it did not run)."""
        for result in self.results:
            if result.check.name == name:
                return result.outcome
        raise KeyError(name)


def run_check(ctx: Context, check: Check) -> Result:
    started = time.monotonic()
    try:
        check.function(ctx)
    except NotOffered as exc:
        outcome, detail, failure = Outcome.NOT_OFFERED, exc.reason, None
    except Failure as exc:
        outcome, detail, failure = Outcome.FAILED, str(exc), exc
    except Exception as exc:  # a check must never take the run down
        outcome, detail, failure = Outcome.ERROR, f"{type(exc).__name__}: {exc}", None
    else:
        outcome, detail, failure = Outcome.PASSED, "", None
    seconds = time.monotonic() - started
    log.info("%s: %s (%.1f s)", check.name, outcome, seconds)
    return Result(check, outcome, detail, failure, seconds)


def run_checks(ctx: Context, checks: Iterable[Check]) -> list[Result]:
    return [run_check(ctx, check) for check in checks]


def run(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    checks: Sequence[str] = (),
    skip: Sequence[str] = (),
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Report:
    """Run the named checks (all when empty, less `skip`) against `base_url` (with `/v1`).

    Raises KitError when the server cannot be used at all, KeyError for an unknown check.
    """
    chosen = select(checks, skip)
    with Context.open(
        base_url, model=model, api_key=api_key, max_examples=max_examples, timeout=timeout
    ) as ctx:
        return Report(ctx.base_url, ctx.model, run_checks(ctx, chosen))
