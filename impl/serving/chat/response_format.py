"""`response_format` on chat (OAI-SO): what to constrain, its refusals, its header, the last check.

The field matrix (policy.py) has already refused it where an endpoint or
engine cannot honour it (`field_not_honoured`: GGUF, completions,
embeddings). `output_format()` reads the request's `response_format`: `json_object`, or
`json_schema` whose schema passes the server's own subset (schema_subset.py)
and the metaschema. `check_combination()` refuses what cannot be combined
with it, with `response_format_unsupported` (docs/DECISIONS.md). After
generation, `OutputFormat.finish()` decides the choice's finish reason: a
document the model ended is parsed and validated with jsonschema, and a
failure is `500 constrained_output_invalid`, never a 200 (OAI-SO-08).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ... import headers as hdr
from ...engines.base import Constraint
from ...errors import ApiError, InvalidParameter
from . import schema_subset

PARAM = "response_format"
JSON_OBJECT: Mapping[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """A constrained output: the schema to enforce and to validate against."""

    kind: str  # json_object | json_schema
    name: str
    schema: Any

    @property
    def constraint(self) -> Constraint:
        # Key order is kept: the grammar writes properties in the schema's order.
        return Constraint(json.dumps(self.schema, separators=(",", ":")))

    def header(self) -> str:
        """X-miLLM-Constrained (OAI-SO-06)."""
        if self.kind == "json_object":
            return "json_object"
        return f"json_schema;name={hdr.sf_string(self.name)}"

    def finish(self, text: str, finish_reason: str) -> str:
        """The finish reason to report; a complete document must parse and validate."""
        if finish_reason != "stop":
            return finish_reason  # "length": the document is incomplete even if it parses
        problem = self.problem(text)
        if problem is not None:
            raise ApiError(
                "constrained_output_invalid",
                f"The model's constrained output is complete but {problem}; "
                "no answer is returned rather than an invalid one.",
                None,
            )
        return finish_reason

    def problem(self, text: str) -> str | None:
        """Why `text` is not a valid document, or None."""
        try:
            document = json.loads(text)
        except ValueError as exc:
            return f"does not parse as JSON ({exc})"
        if self.kind == "json_object" and not isinstance(document, dict):
            return "is not a JSON object"
        with warnings.catch_warnings():  # a pattern Python's `re` reads differently warns
            warnings.simplefilter("ignore")
            error = next(iter(Draft202012Validator(self.schema).iter_errors(document)), None)
        if error is None:
            return None
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        return f"fails the schema at {where}: {error.message}"


def output_format(value: Mapping[str, Any] | None) -> OutputFormat | None:
    """`response_format` (as JSON) as a constrained format; None for none or `text`.
    Refusals before any load."""
    if not isinstance(value, Mapping) or value.get("type") in {None, "text"}:
        return None
    if value["type"] == "json_object":
        return OutputFormat("json_object", "", dict(JSON_OBJECT))
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise InvalidParameter(
            "response_format.json_schema",
            'response_format type "json_schema" needs a `json_schema` object '
            "with `name` and `schema`.",
        )
    if "schema" not in spec or spec["schema"] is None:
        raise InvalidParameter(
            schema_subset.PARAM, "response_format.json_schema needs a `schema` to enforce."
        )
    schema = spec["schema"]
    schema_subset.check(schema)
    try:
        with warnings.catch_warnings():  # the `regex` format check compiles patterns
            warnings.simplefilter("ignore")
            Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidParameter(
            schema_subset.PARAM, f"The schema is not a valid JSON Schema: {exc.message}."
        ) from exc
    return OutputFormat("json_schema", str(spec.get("name", "")), schema)


def check_combination(output: OutputFormat, *, stops: bool, scoring: bool, tools: bool) -> None:
    """Refuse what cannot be combined with a constrained output (OAI-SO-15).

    A stream is served (OAI-SO-14's refusal is superseded, docs/DECISIONS.md): its
    document is validated once it ends, and one that fails ends the stream in an error
    event instead of a finish chunk.
    """
    reasons = [
        (
            stops,
            PARAM,
            "cannot be combined with `stop`: a stop string could cut a document "
            "and report it complete",
        ),
        (scoring, PARAM, "does not apply to scoring requests (nothing is generated)"),
        (tools, "tools", "cannot be combined with `tools`: a tool call is not the document"),
    ]
    for applies, param, why in reasons:
        if applies:
            raise ApiError(
                "response_format_unsupported", f'response_format "{output.kind}" {why}.', param
            )
