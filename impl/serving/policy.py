"""The field matrix, read from spec/policy/fields.yaml (OAI-VALID).

`review()` decides, before any model load, what a request does with each
field: honoured, reported (returned as locations for X-miLLM-Ignored-Fields)
or refused (raises FieldNotHonoured). A field the schema does not declare is
reported wherever it appears. An explicit `null`, for any field at any depth,
known or not, means "no change": never reported, never refused (OAI-VALID-32).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .. import headers as hdr
from ..engines.base import Capability, EngineId
from ..errors import FieldNotHonoured
from .request_schemas import Schema, v1_schema

Rule = str | Mapping[str, Any]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Matrix:
    no_change: Mapping[str, Sequence[Any]]
    endpoints: Mapping[str, Mapping[str, Rule]]
    message: Mapping[str, Rule]


@cache
def matrix() -> Matrix:
    text = (resources.files("miserver.spec") / "policy" / "fields.yaml").read_text("utf-8")
    raw = yaml.safe_load(text)
    return Matrix(raw["no_change"], raw["endpoints"], raw["message"])


def is_no_change(name: str, value: Any) -> bool:
    """True for null and for the field's documented no-change values."""
    # Type-aware: `logprobs: 0` (an int, scoring mode) is not the no-change `false`.
    values = matrix().no_change.get(name, ())
    return value is None or any(value == v and type(value) is type(v) for v in values)


def verdict(rule: Rule, engine: EngineId, capabilities: frozenset[Capability]) -> str:
    """Reduce a rule to `honoured`, `ignored`, `refused` or `pending` (capability missing)."""
    if isinstance(rule, str):
        return rule
    if engine in rule:
        return verdict(rule[engine], engine, capabilities)
    if "needs" in rule:
        if rule["needs"] in capabilities:
            return "honoured"
        return str(rule.get("else", "pending"))
    if "refused" in rule:  # {refused: why}: refused on every engine, saying why
        return "refused"
    raise ValueError(f"malformed rule in fields.yaml: {rule!r}")


def honours(
    endpoint: str, name: str, engine: EngineId, capabilities: frozenset[Capability]
) -> bool:
    """Whether `endpoint` on `engine` uses the field `name` (its row reads `honoured`)."""
    rule = matrix().endpoints[endpoint].get(name)
    return rule is not None and verdict(rule, engine, capabilities) == "honoured"


def _refuse(
    location: str, outcome: str, endpoint: str, engine: EngineId, rule: Rule
) -> FieldNotHonoured:
    where = {
        "chat": "on chat completions",
        "completions": "on text completions",
        "embeddings": "on embeddings",
        "responses": "on responses",
        "messages": "on messages",
    }[endpoint]
    if isinstance(rule, Mapping) and "refused" in rule:
        return FieldNotHonoured(location, f"{where}: {rule['refused']}")
    if outcome == "pending":
        return FieldNotHonoured(location, f"{where} by this server yet (not implemented)")
    return FieldNotHonoured(location, f"{where} with the {engine} engine")


def review(
    endpoint: str, body: Mapping[str, Any], engine: EngineId, capabilities: frozenset[Capability]
) -> list[str]:
    """Locations of unused fields; raises FieldNotHonoured for a refused one."""
    rules = matrix().endpoints[endpoint]
    ignored: list[str] = []
    for name, value in body.items():
        if is_no_change(name, value) or name not in rules:
            continue
        outcome = verdict(rules[name], engine, capabilities)
        if outcome in {"refused", "pending"}:
            raise _refuse(name, outcome, endpoint, engine, rules[name])
        if outcome == "ignored":
            ignored.append(name)
    ignored.extend(_message_fields(body, engine, capabilities))
    if body.get("stream_options") is not None and not body.get("stream"):
        ignored.append("stream_options")
    ignored.extend(undeclared(body, v1_schema().request(endpoint)))
    return ignored


def report_unused(locations: Sequence[str], strict: bool, max_bytes: int) -> dict[str, str]:
    """Unused fields: refused in strict mode (OAI-VALID-10), else one warning without
    values (OAI-VALID-07) and the X-miLLM-Ignored-Fields header (empty dict: none)."""
    if not locations:
        return {}
    if strict:
        raise hdr.refuse_unused(locations)
    log.warning("request_fields_unused: %s", ", ".join(locations))
    return {hdr.IGNORED: hdr.ignored_fields(locations, max_bytes) or ""}


def _message_fields(
    body: Mapping[str, Any], engine: EngineId, capabilities: frozenset[Capability]
) -> Iterator[str]:
    rules = matrix().message
    rows = [("messages", body.get("messages") or ())]
    rows += [
        (f"extra_messages[{k}]", row) for k, row in enumerate(body.get("extra_messages") or ())
    ]
    for where, messages in rows:
        for i, message in enumerate(messages):
            for name, value in message.items():
                if name in rules and value is not None:
                    outcome = verdict(rules[name], engine, capabilities)
                    if outcome in {"ignored", "pending"}:
                        yield f"{where}[{i}].{percent_encode_field(name)}"


def undeclared(value: Any, schema: Schema, location: str = "") -> Iterator[str]:
    """Locations of object members the schema does not declare, depth first; a member
    whose value is null is none (OAI-VALID-32)."""
    if isinstance(value, dict):
        props = schema.properties()
        if props is None:
            return
        for name, member in value.items():
            here = (
                f"{location}.{percent_encode_field(name)}"
                if location
                else percent_encode_field(name)
            )
            if member is None:
                continue
            if name not in props:
                yield here
            else:
                yield from undeclared(member, props[name], here)
    elif isinstance(value, list):
        items = schema.items()
        if items is not None:
            for i, member in enumerate(value):
                yield from undeclared(member, items, f"{location}[{i}]")


def percent_encode_field(name: str) -> str:
    """A field name with `%` and everything outside printable ASCII percent-encoded."""
    if all(0x20 <= ord(c) <= 0x7E and c != "%" for c in name):
        return name
    return "".join(
        c if 0x20 <= ord(c) <= 0x7E and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
        for c in name
    )
