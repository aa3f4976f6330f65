"""Schemathesis runs every operation of spec/openapi/v1.yaml against the live server.

Each operation goes through Schemathesis' coverage phase (boundary and
invalid values of every field, deterministic) and its fuzzing phase
(Hypothesis, `MAX_EXAMPLES` cases, fixed seed), over HTTP against the
`server` fixture. Checks: no 5xx (`not_a_server_error`), documented status
codes, content types, headers and bodies (`*_conformance`), and invalid
data refused with a 4xx (`negative_data_rejection`).

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

`SCHEMATHESIS_SEED` and `SCHEMATHESIS_MAX_EXAMPLES` override the fixed seed
and the example count for a longer exploratory run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis import Case

from miserver.conformance.checks.schema import bounded
from miserver.conformance.fuzzing import CHECKS
from tests.conftest import MODEL_ID
from tests.e2e.conftest import live_server

pytestmark = pytest.mark.e2e

SPECS = Path(__file__).resolve().parents[2] / "spec" / "openapi"
SPEC = SPECS / "v1.yaml"
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "100"))
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "20240601"))

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "output": {"sanitization": {"enabled": False}},  # show token fields in reproductions
        "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
    }
)
schema = schemathesis.openapi.from_path(SPEC, config=CONFIG)
# GET /api/events is held open by design (tests/e2e/test_session_events.py reads it).
api_schema = schemathesis.openapi.from_path(SPECS / "api.yaml", config=CONFIG).exclude(
    path="/events"
)


@schema.parametrize()
def test_every_operation_conforms(case: Case[Any], base_url: str) -> None:
    """OAI-ERR-01, OAI-RESP-01..07, OAI-CMPL-01/02, OAI-MODELS-01/02/07, OAI-CHAT-01..23.

    No generated request gets a 5xx; every response matches the documented
    status, content type, headers and schema; invalid requests get a 4xx.
    """
    bounded(case, MODEL_ID)
    case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)


@pytest.fixture(scope="module")
def api_base_url(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[str]:
    """A server of its own (the fuzzer changes its steering state), with the trained SAEs."""
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    with live_server(tmp_path_factory.mktemp("e2e-api-fuzz"), env) as running:
        yield running.base_url.removesuffix("/v1") + "/api"


@api_schema.parametrize()
def test_every_management_operation_conforms(case: Case[Any], api_base_url: str) -> None:
    """OAI-CONC-03, OAI-ERR-01: every /api steering operation (SAEs, attachments, live values,
    profiles, the active profile) answers in its documented shape; no input gets a 5xx."""
    case.call_and_validate(base_url=api_base_url, checks=CHECKS, timeout=60)
