"""The hostile-input corpus against `miserver serve`: a client fault is a 4xx, never a 5xx.

tests/data/hostile/ (written by `python -m tools.hostile`; its README.md gives
the format) holds the cases, family by family; each family is one test that
sends every case to every route it names, over real HTTP on loopback (httpx;
raw sockets for chunked bodies, hang-ups and byte-exact request targets), and
reports every failing case at once. The server is the default one (`serve`
with no `--model`: the embedded GGUF on llama.cpp), of its own, since the
corpus creates and deletes a profile. After the families, a greedy reply must
equal the one taken before them, byte for byte, and the server's log must hold
no traceback and no 5xx.

Requirements, by family:

- every family: LOC-GEN-17 (no client input produces a 500), OAI-ERR-01 and
  LOC-GEN-09 (every error in OpenAI's shape, its code catalogued), the
  README's "a client fault is never a 500" and `param` naming the field's path;
- malformed, bytes, chunked: LOC-GEN-14 (a body that is not JSON is a 400);
- types: LOC-GEN-15, LOC-GEN-16 (not an object, a wrong JSON type: 400
  `invalid_request` on /api), LOC-CHAT-04 (a role of the wrong type);
- depth, duplicates, surrogates, numbers: issue 24's strict reader (400:
  the text at fault `invalid_json` on /v1, `invalid_request` on /api; one
  value at fault `invalid_parameter`; `param` the value, or `body`);
- content_type: LOC-GEN-19, LOC-GEN-20, LOC-SEC-25..27 (415 before any handler);
- size: LOC-SEC-67 (the 8 MiB cap, chunked bodies too);
- arrays: OAI-EMB-26 (EMBEDDINGS_MAX_INPUTS), OAI-ERR-04 (context_length_exceeded),
  OAI-VALID-15 (field_not_honoured);
- paths: LOC-GEN-17 for path segments, layers and query strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.e2e.conftest import LiveServer, live_server
from tools.fakehub import Hub, serve_hub
from tools.hostile import client, corpus

pytestmark = pytest.mark.e2e

# One compute thread (the test shares two cores with the server); a body that loses its
# `max_tokens` to an edit asks for 16 tokens, not 512.
SERVER_ENV = {"MISERVER_THREADS": "1", "DEFAULT_MAX_TOKENS": "16"}
FIVE_XX = re.compile(r'HTTP/1\.[01]" 5\d\d ')
SHOWN = 60  # failing requests listed in full; the rest are counted


@dataclass(frozen=True, slots=True)
class Hostile:
    server: LiveServer
    origin: str  # http://127.0.0.1:PORT
    before: str  # the greedy reply before the corpus


def greedy(origin: str) -> str:
    with httpx.Client() as http:
        return client.greedy(http, origin, corpus.model())


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    workdir = tmp_path_factory.mktemp("e2e-hostile")
    with (
        serve_hub(Hub()) as site,  # /api/hf reaches a site that has none of the corpus' repos
        live_server(workdir, SERVER_ENV, model=None, args=["--hf-endpoint", site]) as server,
    ):
        origin = server.base_url.removesuffix("/v1")
        yield Hostile(server, origin, greedy(origin))


@pytest.mark.parametrize("family", corpus.families())
def test_every_case_gets_its_answer_and_the_server_keeps_serving(
    family: str, hostile: Hostile
) -> None:
    """Each case gets its expected status (4xx unless the case says otherwise), OpenAI's
    error shape with a catalogued code, and its pinned code and `param`; none gets a 5xx.
    After the family (hang-ups included) the server still answers."""
    failures: list[str] = []
    sent = 0
    with httpx.Client() as http:
        for request in corpus.requests(family):
            failures += client.problems(request, client.send(http, hostile.origin, request))
            sent += 1
        alive = http.get(f"{hostile.origin}/v1/models", timeout=30)
    assert alive.status_code == 200, f"the server stopped answering after {family}"
    shown = "\n".join(failures[:SHOWN])
    more = f"\n... and {len(failures) - SHOWN} more" if len(failures) > SHOWN else ""
    assert not failures, f"{len(failures)} problems in {sent} requests:\n{shown}{more}"


def test_the_corpus_leaves_the_server_as_it_was(hostile: Hostile) -> None:
    """Run after the families (file order): the greedy reply is byte-identical to the one
    taken before them, and the log holds no traceback and no 5xx (LOC-GEN-17)."""
    assert greedy(hostile.origin) == hostile.before
    log = hostile.server.log_path.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log, hostile.server.log_tail(80)
    assert not FIVE_XX.findall(log), "\n".join(
        line for line in log.splitlines() if FIVE_XX.search(line)
    )
