"""Schemathesis runs every operation of spec/openapi/v1.yaml against the live server.

Each operation goes through Schemathesis' coverage phase (boundary values
of every field, deterministic) and its fuzzing phase (Hypothesis,
`POSITIVE_EXAMPLES` cases, fixed seed), over HTTP against the `server`
fixture; the negative runs below do the same with invalid values. Checks: no
5xx (`not_a_server_error`), documented status codes, content types, headers
and bodies (`*_conformance`), and invalid data refused with a 4xx
(`negative_data_rejection`).

`positive_data_acceptance` is not run: the contract refuses schema-valid
requests on purpose (400 `field_not_honoured` for fields this engine does
not honour yet, spec/policy/fields.yaml; 404 for an unknown model; 400 for
cross-field rules such as `n > 1` with `stream`).

To keep the real model fast, the conformance kit's `bounded()` (the same edit
`miserver-conformance` makes) edits every generated case before it is sent
(Schemathesis then re-labels a case as positive or negative by what is
actually sent):

- `max_tokens` / `max_completion_tokens` above 4, or 0 (the server's
  n-predict), become 4, and a body with neither (or null) gets
  `max_tokens: 4` (the server default is 512);
- `n` above 2 becomes 2;
- `stream: true` becomes `false` (SSE is covered by test_openai_sdk.py);
- a non-empty string `model` becomes the served model's id, so that
  generation requests reach the model instead of stopping at 404.

The runs above use Schemathesis' positive mode (`POSITIVE_EXAMPLES` cases
an operation in its fuzzing phase). A second pair of runs,
`NEGATIVE_EXAMPLES` each, uses its negative mode over both documents (issue
24): every case breaks the schema somewhere (a wrong type at some depth, a
missing required field, a value out of range, an unknown enum value, a bad
header or path parameter), and each must get a documented 4xx in the error
schema, never a 5xx. It runs against the default engine (the GGUF model, as
`miserver serve` starts) so that what the server reaches after a case it
wrongly accepts is cheap; the operations that take no input (no parameter,
no body) are left out of it, having nothing to break. Each mode is generated
by one pair of runs only
(the first pair once ran "all" mode, whose negative half the second pair
repeated), and every run keeps its coverage phase whole.

The seed is fixed, so a failure reproduces with the same command.
`SCHEMATHESIS_SEED` and `SCHEMATHESIS_MAX_EXAMPLES` override the seed and
both example counts for a longer exploratory run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from schemathesis import Case

from miserver.conformance.checks.schema import bounded
from miserver.conformance.fuzzing import CHECKS
from tests.conftest import GGUF_ID, MODEL_ID
from tests.e2e.conftest import live_server
from tools.fakehub import Hub, serve_hub

pytestmark = pytest.mark.e2e


SPECS = Path(__file__).resolve().parents[2] / "spec" / "openapi"
SPEC = SPECS / "v1.yaml"
POSITIVE_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "30"))
NEGATIVE_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "30"))
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20240601"))
METHODS = ("get", "put", "post", "delete", "patch")


def _config(mode: str, examples: int) -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "output": {"sanitization": {"enabled": False}},  # show token fields in reproductions
            "generation": {"mode": mode, "max-examples": examples, "database": "none"},
            # GET /api/plan measures this machine on every call (LOC-PLAN-05's second or two,
            # several under load) and its whole input is two optional 0/1 query flags: the
            # coverage phase sends every value of each, and the fuzzing phase one case more
            # rather than 50 that repeat them
            "operations": [{"include-name": "GET /plan", "generation": {"max-examples": 1}}],
        }
    )


def _documents(mode: str, examples: int) -> tuple[Any, Any]:
    """The /v1 and /api documents; GET /api/events is held open by design
    (tests/e2e/test_session_events.py reads it)."""
    config = _config(mode, examples)
    v1 = schemathesis.openapi.from_path(SPEC, config=config)
    api = schemathesis.openapi.from_path(SPECS / "api.yaml", config=config)
    return v1, api.exclude(path="/events")


schema, api_schema = _documents("positive", POSITIVE_EXAMPLES)
negative_schema, negative_api_schema = _documents("negative", NEGATIVE_EXAMPLES)


def _without_input(document: Path) -> list[str]:
    """The operations of `document` that take no parameter and no body: a negative case
    has nothing to break there (Schemathesis would skip each)."""
    paths = yaml.safe_load(document.read_text(encoding="utf-8"))["paths"]
    return [
        f"{method.upper()} {path}"
        for path, item in paths.items()
        for method, operation in item.items()
        if method in METHODS
        and not item.get("parameters")
        and not operation.get("parameters")
        and "requestBody" not in operation
    ]


# Any string is a model id, and any a response, file or batch id: a path parameter has no negative
# value to generate, and these operations take nothing else.
ONLY_AN_ID = [
    "DELETE /responses/{response_id}",
    "POST /responses/{response_id}/cancel",
    "GET /files/{file_id}",
    "DELETE /files/{file_id}",
    "GET /files/{file_id}/content",
    "GET /batches/{batch_id}",
    "POST /batches/{batch_id}/cancel",
]
negative_schema = negative_schema.exclude(path="/models/{model_id}").exclude(
    name=[*_without_input(SPEC), *ONLY_AN_ID]
)
negative_api_schema = negative_api_schema.exclude(name=_without_input(SPECS / "api.yaml"))


@schema.parametrize()
def test_every_operation_conforms(case: Case[Any], base_url: str) -> None:
    """OAI-ERR-01, OAI-RESP-01..07, OAI-CMPL-01/02, OAI-MODELS-01/02/07, OAI-CHAT-01..23.

    No generated request gets a 5xx; every response matches the documented
    status, content type, headers and schema (invalid requests: the negative runs below).
    """
    bounded(case, MODEL_ID)
    case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)


@pytest.fixture(scope="module")
def api_base_url(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[str]:
    """A server of its own (the fuzzer changes its steering state), with the trained SAEs and
    `--hf-endpoint` on a fake site on loopback (no test reaches the internet). Its planner
    times the kernels in process (`--no-isolated-probes`, LOC-PLAN-08): GET /plan is fuzzed
    for its shapes, and a child process per call (a server's start, seconds) would be most of
    this module's time; tests/unit/test_planner.py times the child."""
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    workdir = tmp_path_factory.mktemp("e2e-api-fuzz")
    with (
        serve_hub(Hub()) as site,  # /api/hf reaches a site (none of the fuzzer's repos exist)
        live_server(workdir, env, args=["--hf-endpoint", site, "--no-isolated-probes"]) as running,
    ):
        yield running.base_url.removesuffix("/v1") + "/api"


@api_schema.parametrize()
def test_every_management_operation_conforms(case: Case[Any], api_base_url: str) -> None:
    """OAI-CONC-03, OAI-ERR-01: every /api steering operation (SAEs, attachments, live values,
    profiles, the active profile) answers in its documented shape; no input gets a 5xx."""
    case.call_and_validate(base_url=api_base_url, checks=CHECKS, timeout=60)


@pytest.fixture(scope="module")
def default_base_url(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[str]:
    """The server as `miserver serve` starts it (the embedded GGUF), with the trained SAEs."""
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    with live_server(tmp_path_factory.mktemp("e2e-negative"), env, model=None) as running:
        yield running.base_url.removesuffix("/v1")


@negative_schema.parametrize()
def test_every_invalid_v1_request_is_a_documented_4xx(
    case: Case[Any], default_base_url: str
) -> None:
    """Issue 24, OAI-ERR-01: negative mode alone over /v1: no 5xx, a
    documented status and the error schema for every schema-breaking request."""
    bounded(case, GGUF_ID)
    case.call_and_validate(base_url=f"{default_base_url}/v1", checks=CHECKS, timeout=60)


@negative_api_schema.parametrize()
def test_every_invalid_api_request_is_a_documented_4xx(
    case: Case[Any], default_base_url: str
) -> None:
    """Issue 24, LOC-GEN-09, LOC-GEN-14..16: negative mode alone over /api: no 5xx, a
    documented status and the error schema for every schema-breaking request."""
    case.call_and_validate(base_url=f"{default_base_url}/api", checks=CHECKS, timeout=60)
