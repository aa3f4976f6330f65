"""OpenAI's Batch API on the default GGUF model (issue 50, contract 0.31.0): lines run through
their routes in process, so each output line holds the answer, the steering statement and the
probe verdicts an HTTP client would get for the same body; bad lines become error lines; the
batch routes' refusals. The `openai` SDK's own tests and the `kill -9` one are
tests/e2e/test_batches_sdk.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf as gguf_lib
import jsonschema
import pytest
from starlette.testclient import TestClient

from miserver import contract
from miserver.app import Server
from miserver.probes.verdicts import serialize
from miserver.settings import Settings
from tests.conftest import ENGINE_THREADS, GGUF_ID, LocalClient, cache_dir
from tests.errors import error_of
from tests.models import header_only_gguf
from tests.steering_http import USER, attach, inline, inline_value, reset

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
PAIRS = {5: 80.0}  # moves SmolLM2's greedy reply from its second token (test_llamacpp_steering)
JSON = {"Content-Type": "application/json"}
DONE = ("completed", "failed", "cancelled", "expired")
RESULT_SCHEMA = json.loads(contract.schema_bytes("mi-probe-result-v1.json"))
FRENCH = "Bonjour, pourriez-vous me dire quelle heure il est à Paris maintenant ?"
ENGLISH = "Hello, could you tell me what time it is in London right now?"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, saes_dir: Path, gguf_path: Path
) -> Iterator[TestClient]:
    """The embedded GGUF with the SAEs dir, and a models dir where `Other` has one
    quantization and `Twin` two (bare names: 404 and 400 AMBIGUOUS_MODEL_NAME)."""
    models = tmp_path_factory.mktemp("models")
    (models / "Other.Q4_1.gguf").symlink_to(gguf_path)
    (models / "Twin.Q4_1.gguf").symlink_to(gguf_path)
    header_only_gguf(models / "Twin.Q8_0.gguf", gguf_lib.LlamaFileType.MOSTLY_Q8_0)
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("batches"),
        cache_dir=cache_dir(),
        saes_dir=saes_dir,
        models_dir=models,
        threads=ENGINE_THREADS,
    )
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(autouse=True)
def clean(server: TestClient) -> Iterator[None]:
    """No steering and no probe before and after each test."""
    yield
    reset(server)
    for p in server.get("/api/probes").json()["data"]:
        server.delete(f"/api/probes/{p['name']}", headers=JSON)


def chat(content: str = USER[0]["content"], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": GGUF_ID, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def request_line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def upload(client: TestClient, *lines: str) -> str:
    content = "\n".join(lines) + "\n"
    made = client.post(
        "/v1/files", json={"purpose": "batch", "filename": "in.jsonl", "content": content}
    )
    assert made.status_code == 200, made.text
    return str(made.json()["id"])


def make(client: TestClient, *lines: str, endpoint: str = CHAT) -> dict[str, Any]:
    """The batch of `lines`, as made."""
    body = {"input_file_id": upload(client, *lines), "endpoint": endpoint}
    made = client.post("/v1/batches", json=body | {"completion_window": "24h"})
    assert made.status_code == 200, made.text
    return dict(made.json())


def run(client: TestClient, *lines: str, endpoint: str = CHAT) -> dict[str, Any]:
    """The batch of `lines`, made and waited for until it ends."""
    return finished(client, make(client, *lines, endpoint=endpoint)["id"])


def finished(client: TestClient, batch_id: str, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (batch := client.get(f"/v1/batches/{batch_id}").json())["status"] not in DONE:
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return dict(batch)


def results(client: TestClient, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by `custom_id`."""
    if file_id is None:
        return {}
    text = client.get(f"/v1/files/{file_id}/content").text
    found = [json.loads(raw) for raw in text.splitlines()]
    by_id = {line["custom_id"]: line for line in found}
    assert len(by_id) == len(found)  # each line once
    return by_id


def test_a_steered_batch_states_its_steering_on_every_line(server: TestClient) -> None:
    """Issue 50 acceptance, OAI-HDR-17: a batch whose lines steer (inline, on the GGUF) and
    do not: every output line's `response.millm.headers` holds the X-miLLM-Steering value
    an HTTP client gets for the same body, and its body the same greedy text."""
    attach(server)
    steered, plain = chat(steering=inline(PAIRS)), chat()
    batch = run(
        server, *(request_line(f"s{i}", steered) for i in range(3)), request_line("p", plain)
    )
    assert batch["status"] == "completed" and batch["error_file_id"] is None
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    out = results(server, batch["output_file_id"])
    alone = {"s": server.post(CHAT, json=steered), "p": server.post(CHAT, json=plain)}
    for custom_id, line in out.items():
        answer = alone[custom_id[0]]
        response = line["response"]
        assert response["status_code"] == 200 and line["error"] is None
        headers = response["millm"]["headers"]
        assert headers["x-millm-steering"] == answer.headers["x-millm-steering"]
        got = response["body"]["choices"][0]["message"]["content"]
        assert got == answer.json()["choices"][0]["message"]["content"]
    assert out["s0"]["response"]["millm"]["headers"]["x-millm-steering"] == inline_value(PAIRS)
    assert out["p"]["response"]["millm"]["headers"]["x-millm-steering"] == "none"
    assert batch["usage"]["output_tokens"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in out.values()
    )


def test_a_probe_armed_during_a_batch_gives_verdicts_per_line(
    server: TestClient, trained_probe: Path
) -> None:
    """Issue 50 acceptance, OAI-PROBE-07: with the French probe armed, every output line's
    body carries `millm_probe_verdicts` (valid mi.probe.result/v1 objects of that line's
    request) and its headers the X-miLLM-Probe-Verdicts value for them; the French line's
    verdict is not the English one's."""
    armed = server.post("/api/probes/import", json={"path": str(trained_probe), "armed": True})
    assert armed.status_code in (200, 201), armed.text
    batch = run(server, request_line("fr", chat(FRENCH)), request_line("en", chat(ENGLISH)))
    out = results(server, batch["output_file_id"])
    assert set(out) == {"fr", "en"}
    verdicts = {}
    for custom_id, line in out.items():
        body = line["response"]["body"]
        found = body["millm_probe_verdicts"]
        assert found
        for result in found:
            jsonschema.validate(result, RESULT_SCHEMA)
            assert result["request_id"] == body["id"]
        headers = line["response"]["millm"]["headers"]
        assert headers["x-millm-probe-verdicts"] == serialize(found, choices=1)
        verdicts[custom_id] = {(r["window"], r["verdict"]) for r in found}
    assert verdicts["fr"] != verdicts["en"]


def preempted(client: TestClient) -> float:
    """How many answers `preempted` the server gave so far (its refusals counter)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("miserver_refusals_total") and 'code="preempted"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_interactive_request_takes_a_row_from_a_running_batch(server: TestClient) -> None:
    """Issue 50 item 3 (lower priority): while a batch fills every row, interactive requests
    are answered at once, each taking a batch line's row (that line is preempted: the
    server's refusals count `preempted`); the preempted lines run again, so the batch still
    ends with every line once and whole."""
    long = chat(max_tokens=48, ignore_eos=True)
    batch = make(server, *(request_line(f"l{i}", long) for i in range(16)))
    deadline = time.monotonic() + 120
    while server.get("/api/health/inference").json()["slots_in_use"] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    before = preempted(server)
    for i in range(3):
        answer = server.post(CHAT, json=chat(f"Say {i}.", max_tokens=4))
        assert answer.status_code == 200, answer.text
    assert preempted(server) > before
    done = finished(server, batch["id"])
    assert done["request_counts"] == {"total": 16, "completed": 16, "failed": 0}
    out = results(server, done["output_file_id"])
    assert sorted(out) == sorted(f"l{i}" for i in range(16))
    assert {line["response"]["body"]["usage"]["completion_tokens"] for line in out.values()} == {48}


def test_bad_lines_become_error_lines_and_the_batch_goes_on(server: TestClient) -> None:
    """Issue 50 item 3, OAI-GGUF-08: lines that are not requests, a line naming a bare
    repository name (404 model_not_found while one quantization exists, 400
    AMBIGUOUS_MODEL_NAME with two: the route's own refusals, given at validation), and one
    the route refuses when it runs (400 naming the field) go to the error file in input
    order; the good line runs."""
    lines = (
        "not json",
        request_line("other", chat() | {"model": "Other"}),
        request_line("twin", chat() | {"model": "Twin"}),
        request_line("wrong-url", chat(), url="/v1/completions"),
        request_line("bad-field", chat(max_tokens=-1)),
        request_line("good", chat()),
    )
    made = make(server, *lines)
    assert made["request_counts"] == {"total": 6, "completed": 0, "failed": 4}  # at validation
    batch = finished(server, made["id"])
    assert batch["request_counts"] == {"total": 6, "completed": 1, "failed": 5}
    errors = results(server, batch["error_file_id"])
    assert list(errors) == [None, "other", "twin", "wrong-url", "bad-field"]
    assert errors[None]["error"]["code"] == "invalid_json" and errors[None]["error"]["line"] == 1
    assert errors["wrong-url"]["error"]["param"] == "url"
    for custom_id, status in (("other", 404), ("twin", 400), ("bad-field", 400)):
        response = errors[custom_id]["response"]
        direct = server.post(
            CHAT,
            json=json.loads(
                lines[[None, "other", "twin", "wrong-url", "bad-field"].index(custom_id)]
            )["body"],
        )
        assert response["status_code"] == direct.status_code == status
        assert response["body"]["error"]["code"] == direct.json()["error"]["code"]
        assert response["body"]["error"]["param"] == direct.json()["error"]["param"]
    assert list(results(server, batch["output_file_id"])) == ["good"]


def test_embeddings_and_text_completions_run_as_batches(server: TestClient) -> None:
    """Issue 50 item 2: the endpoints a batch takes besides chat: text completions and
    embeddings lines give the routes' bodies."""
    completion = {"model": GGUF_ID, "prompt": "One, two,", "max_tokens": 4, "temperature": 0}
    batch = run(
        server, request_line("c", completion, "/v1/completions"), endpoint="/v1/completions"
    )
    [line] = results(server, batch["output_file_id"]).values()
    assert line["response"]["body"]["object"] == "text_completion"
    embedding = {"model": GGUF_ID, "input": ["a cat", "a dog"]}
    batch = run(server, request_line("e", embedding, "/v1/embeddings"), endpoint="/v1/embeddings")
    [line] = results(server, batch["output_file_id"]).values()
    assert [d["index"] for d in line["response"]["body"]["data"]] == [0, 1]


@pytest.mark.parametrize(
    ("change", "status", "code", "param"),
    [
        ({"input_file_id": "file-none"}, 404, "not_found", "input_file_id"),
        ({"endpoint": "/v1/moderations"}, 400, "invalid_parameter", "endpoint"),
        ({"completion_window": "1h"}, 400, "invalid_parameter", "completion_window"),
        ({"metadata": {str(i): "v" for i in range(17)}}, 400, "invalid_parameter", "metadata"),
        ({"metadata": {"k" * 65: "v"}}, 400, "invalid_parameter", "metadata"),
        ({"metadata": {"k": "v" * 513}}, 400, "invalid_parameter", "metadata"),
    ],
)
def test_batch_refusals_name_the_field(
    server: TestClient, change: dict[str, Any], status: int, code: str, param: str
) -> None:
    """Issue 50: a batch that cannot be made is refused naming its field, and nothing is
    kept."""
    before = server.get("/v1/batches").json()["data"]
    body = {"input_file_id": upload(server, request_line("a", chat())), "endpoint": CHAT}
    refused = server.post("/v1/batches", json=body | {"completion_window": "24h"} | change)
    error_of(refused, status, code, param)
    assert server.get("/v1/batches").json()["data"] == before


def test_an_input_of_another_purpose_or_no_line_is_refused(server: TestClient) -> None:
    """Issue 50: a batch's output file is not an input (400 input_file_id), nor is a file
    with no request line."""
    batch = run(server, request_line("a", chat()))
    for file_id in (batch["output_file_id"], upload(server, "")):
        body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
        refused = server.post("/v1/batches", json=body)
        error_of(refused, 400, "invalid_parameter", "input_file_id")
    error_of(server.get("/v1/batches/batch_none"), 404, "not_found", "batch_id")
    done = server.post(f"/v1/batches/{batch['id']}/cancel", headers=JSON)
    error_of(done, 409, "conflict", "batch_id")
