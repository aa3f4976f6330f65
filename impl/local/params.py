"""The parameter table, read from spec/policy/params.yaml (LOC-CONC-01, LOC-PARAMS).

`table()` is the rows in form order; `Param.parse` turns a JSON value into
the row's value or says why it cannot (LOC-PARAMS-13).
Each row's `flag` is a `miserver serve` flag (LOC-PARAMS-09): `add_flags`
adds those the settings do not already give, and `launch_values` reads them
back as the launch layer of the config (docs/DECISIONS.md, config layers).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

AUTO = "auto"
_INTERNAL = ("writes_files", "flag_auto")  # table fields GET /api/params never serves


class Refused(ValueError):
    """A value the row does not take; the message is the `rejected` reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    key: str
    type: str  # bool | int | float | path | text | choice
    scope: str  # request | session
    flag: str | None
    default: Any
    accepts_auto: bool
    writes_files: bool  # launch only: refused over PUT /api/config (LOC-SEC-57)
    flag_auto: str | None  # what the launcher takes for "auto"
    minimum: float | None
    maximum: float | None
    choices: tuple[str, ...]
    switches: tuple[tuple[str, Any], ...]  # a boolean's flags and the value each gives
    wire: Mapping[str, Any]  # the row as GET /api/params serves it

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Param:
        return cls(
            key=row["key"],
            type=row["type"],
            scope=row["scope"],
            flag=row["flag"],
            default=row["default"],
            accepts_auto=bool(row.get("accepts_auto", False)),
            writes_files=bool(row.get("writes_files", False)),
            flag_auto=row.get("flag_auto"),
            minimum=row.get("min"),
            maximum=row.get("max"),
            choices=tuple(c["value"] for c in row.get("choices", ())),
            switches=tuple((s["flag"], s["value"]) for s in row.get("switches", ())),
            wire={k: v for k, v in row.items() if k not in _INTERNAL},
        )

    def served(self, default: Any) -> dict[str, Any]:
        """The row for GET /api/params, with the server's `default`."""
        return {**self.wire, "default": default}

    def parse(self, value: Any) -> Any:
        """The value in the row's own type; raises Refused with the reason."""
        if value == AUTO and isinstance(value, str) and self.type in ("int", "float"):
            if not self.accepts_auto:
                raise Refused('"auto" is not accepted')
            return AUTO
        return _PARSERS[self.type](self, value)

    def from_text(self, text: str) -> Any:
        """A command-line value as the row's value (argparse's `type`)."""
        try:
            raw: Any = text
            if self.type == "int" and text != AUTO:
                raw = int(text)
            elif self.type == "float" and text != AUTO:
                raw = float(text)
            return self.parse(raw)
        except (ValueError, Refused) as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc

    def switch(self, value: Any) -> str | None:
        """The flag that gives a boolean `value` (the bare `flag` for true)."""
        found = next((flag for flag, given in self.switches if given is value), None)
        return found if found is not None or value is not True else self.flag

    def _number(self, value: float) -> None:
        if self.minimum is not None and value < self.minimum:
            raise Refused(f"below the minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise Refused(f"above the maximum {self.maximum}")


def _bool(param: Param, value: Any) -> bool:
    if not isinstance(value, bool):
        raise Refused("expected a boolean")
    return value


def _int(param: Param, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused("expected an integer" + (' or "auto"' if param.accepts_auto else ""))
    param._number(value)
    return value


def _float(param: Param, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused("expected a number" + (' or "auto"' if param.accepts_auto else ""))
    if not math.isfinite(value):
        raise Refused("expected a finite number")
    param._number(value)
    return float(value)


def _text(param: Param, value: Any) -> str:
    if not isinstance(value, str):
        raise Refused("expected a string")
    return value


def _choice(param: Param, value: Any) -> str:
    text = _text(param, value)
    if text not in param.choices:
        raise Refused(f"unknown choice {text!r}; one of {', '.join(param.choices)}")
    return text


_PARSERS = {
    "bool": _bool,
    "int": _int,
    "float": _float,
    "path": _text,
    "text": _text,
    "choice": _choice,
}


@cache
def table() -> Sequence[Param]:
    """Every row of spec/policy/params.yaml, in form order."""
    text = (resources.files("miserver.spec") / "policy" / "params.yaml").read_text("utf-8")
    return tuple(Param.from_row(row) for row in yaml.safe_load(text))


def by_key() -> Mapping[str, Param]:
    return {param.key: param for param in table()}


def _dest(param: Param) -> str:
    return f"param:{param.key}"


def add_flags(parser: argparse.ArgumentParser, taken: Collection[str]) -> None:
    """A `miserver serve` flag for each row whose flag is not in `taken` (the settings')."""
    for param in table():
        if param.flag is None or param.flag in taken:
            continue
        help = str(param.wire["help"])
        if param.switches:
            for flag, value in param.switches:
                parser.add_argument(
                    flag, dest=_dest(param), action="store_const", const=value, help=help
                )
        else:
            parser.add_argument(param.flag, dest=_dest(param), type=param.from_text, help=help)


def launch_values(args: argparse.Namespace) -> dict[str, Any]:
    """The rows' values given as flags (`add_flags`), by key."""
    given = {p.key: getattr(args, _dest(p), None) for p in table()}
    return {key: value for key, value in given.items() if value is not None}


def described() -> list[dict[str, Any]]:
    """`miserver serve --describe-params`: GET /api/params with the table's own defaults
    where the server shows its launch settings (LOC-PARAMS-02)."""
    return [param.served(param.default) for param in table()]
